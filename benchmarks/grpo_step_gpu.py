"""GRPO through main_ppo on one GPU: a Qwen2.5-0.5B-shaped model (random weights), a few steps, timing breakdown.

Builds the model (bf16 safetensors, Qwen's 151936-token vocabulary) with the quick-start's byte-level tokenizer (ids
the tokenizer does not know decode to nothing), writes
arithmetic prompts in the GSM8K schema, runs `verlx.trainer.main_ppo` with the native engine and prints each
step's phase timings from the metrics JSONL (also copied to $OUT). Random weights rarely emit EOS, so responses run
to max_response_length: the step timings are those of full-length responses.

  python benchmarks/grpo_step_gpu.py --steps 3 --prompts 64 --n 8 --response-length 256
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=151936),
}
SHOWN = ("timing_s/step", "timing_s/gen", "timing_s/update_weights", "timing_s/reward", "timing_s/old_log_prob",
         "timing_s/ref", "timing_s/adv", "timing_s/update_actor", "perf/throughput", "perf/max_memory_allocated_gb",
         "perf/max_memory_allocated_gb/gen", "perf/mfu/actor", "response_length/mean", "rollout/logprob_diff",
         "rollout/engine_asleep_gb", "actor/entropy", "actor/pg_loss")


def build_model(out_dir: str, shape: str) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from verlx.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(model_max_length=4096)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, tie_word_embeddings=True,
                         rope_theta=1000000.0, eos_token_id=im_end, pad_token_id=tokenizer.pad_token_id,
                         dtype="bfloat16")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=[im_end, tokenizer.eos_token_id],
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out_dir)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="0.5b", choices=list(SHAPES))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=64, help="data.train_batch_size")
    p.add_argument("--n", type=int, default=8, help="actor_rollout_ref.rollout.n")
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--engine", default="native")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--extra", nargs="*", default=[], help="more key=value overrides")
    args = p.parse_args()

    work = tempfile.mkdtemp(prefix="verlx-grpo-")
    model_dir, data_dir, out_dir = (os.path.join(work, d) for d in ("model", "data", "out"))
    build_model(model_dir, args.shape)
    subprocess.run([sys.executable, os.path.join(ROOT, "examples/data_preprocess/arithmetic.py"),
                    "--local_save_dir", data_dir, "--test_size", "256"], check=True)
    per_gpu = args.prompts * args.n // args.gpus
    overrides = [
        "algorithm.adv_estimator=grpo", f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet", f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=64", f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // 2}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={min(16, per_gpu // 2)}",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={min(32, per_gpu)}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={min(32, per_gpu)}",
        f"actor_rollout_ref.rollout.name={args.engine}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        f"trainer.n_gpus_per_node={args.gpus}", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false", "trainer.logger=[console,file]", f"trainer.output_dir={out_dir}",
        f"trainer.default_local_dir={work}/ckpt", "trainer.progress_bar=false", *args.extra,
    ]
    rc = subprocess.run([sys.executable, "-m", "verlx.trainer.main_ppo", *overrides], cwd=ROOT).returncode
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    rows = [json.loads(line) for line in open(metrics_path)] if os.path.exists(metrics_path) else []
    print("\n| step | " + " | ".join(k.split("/", 1)[1] for k in SHOWN) + " |")
    print("|---" * (len(SHOWN) + 1) + "|")
    for row in rows:
        cells = [f"{row[k]:.3g}" if isinstance(row.get(k), (int, float)) else "-" for k in SHOWN]
        print(f"| {row['step']} | " + " | ".join(cells) + " |")
    if os.environ.get("OUT") and rows:
        shutil.copy(metrics_path, os.path.join(os.environ["OUT"], "grpo_metrics.jsonl"))
    return rc


if __name__ == "__main__":
    sys.exit(main())
