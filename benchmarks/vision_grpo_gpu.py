"""GRPO through main_ppo with a vision-language policy (a Qwen2-VL or Qwen3-VL of random weights) and the hf, vLLM or
SGLang rollout engine, on geo3k-format image questions: the first runs of the vision-language path on a GPU
(docs/vision_language.md).

Builds the model (`--shape tiny`: the tests' Qwen2-VL; `2b`: Qwen2-VL-2B's shape, bf16; `qwen3-vl-tiny` and
`qwen3-vl-2b` the same of Qwen3-VL, whose 2B ties its embeddings), writes geo3k-format rows
with random images of several sizes through examples/data_preprocess/geo3k.py, runs `verlx.trainer.main_ppo` (the
reward scores the response's length, so that random weights still get advantages and a real update) and
prints each step's timings and the log-prob agreements (engine vs trainer, old_log_probs vs the update's first
forward) from the metrics JSONL (copied to $OUT when set).

  python benchmarks/vision_grpo_gpu.py --shape 2b --steps 3                     # one GPU, the hf engine
  python benchmarks/vision_grpo_gpu.py --shape 2b --steps 3 --engine vllm       # vLLM: images as multi_modal_data
  python benchmarks/vision_grpo_gpu.py --shape 2b --steps 3 --engine sglang     # SGLang: images as image_data
  python benchmarks/vision_grpo_gpu.py --shape qwen3-vl-2b --engine vllm       # Qwen3-VL (DeepStack, 16-pixel patches)
  python benchmarks/vision_grpo_gpu.py --smoke [--shape qwen3-vl-2b]            # CPU, the tiny shape of that model

rollout/logprob_diff_max (the engine's log-probs against the trainer's on the same batch) is the check that the
engine saw each prompt's images at the trainer's positions.
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
sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]

#: shape → (model_type, text shape, vision shape, tied embeddings); the tiny shapes are the tests' (helpers/tiny_vlm.py)
SHAPES = {
    "tiny": ("qwen2_vl", {}, {}, False),
    "2b": ("qwen2_vl",
           dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                num_attention_heads=12, num_key_value_heads=2, max_position_embeddings=32768,
                rope_parameters={"rope_type": "default", "mrope_section": [16, 24, 24], "rope_theta": 1e6}),
           dict(depth=32, embed_dim=1280, hidden_size=1536, num_heads=16, mlp_ratio=4), False),
    "qwen3-vl-tiny": ("qwen3_vl", {}, {}, False),
    # Qwen3-VL-2B-Instruct's config.json
    "qwen3-vl-2b": ("qwen3_vl",
                    dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                         num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=262144,
                         rope_parameters={"rope_type": "default", "mrope_section": [24, 20, 20],
                                          "mrope_interleaved": True, "rope_theta": 5e6}),
                    dict(depth=24, hidden_size=1024, intermediate_size=4096, num_heads=16, out_hidden_size=2048,
                         num_position_embeddings=2304, deepstack_visual_indexes=[5, 11, 17]), True),
}
#: the tiny shape of each model type (--smoke)
TINY = {"qwen2_vl": "tiny", "qwen3_vl": "qwen3-vl-tiny"}
# The update's first forward against old_log_prob: on the GPU the FSDP parity table's bf16 bound on one token's
# log-prob (parity_2gpu.TOLERANCE["gpu"]["logprob_max_abs"]; one bf16 step of a logit near 10 is 0.0625: 0.0675
# was measured at the 2B shape on 2026-11-26 with ppo_kl 1.3e-5); the tiny shapes run in fp32 on the CPU.
ON_POLICY_TOLERANCE = {"tiny": 1e-2, "2b": 0.15, "qwen3-vl-tiny": 1e-2, "qwen3-vl-2b": 0.15}
IMAGE_SIZES = [(224, 224), (336, 224), (224, 448), (448, 448)]
SHOWN = ("timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor",
         "response_length/mean", "rollout/logprob_diff_max", "actor/on_policy_log_prob_diff_max", "actor/grad_norm",
         "actor/kl_loss", "perf/max_memory_allocated_gb")


def prepare(work: str, shape: str, images: int) -> tuple[str, str]:
    import torch

    from helpers.tiny_vlm import png_bytes, random_image, save_tiny_vlm
    from verlx.data import write_parquet_atomic

    model_type, text, vision, tied = SHAPES[shape]
    model_dir = save_tiny_vlm(os.path.join(work, "model"), model_type, tie_word_embeddings=tied, text_shape=text,
                              vision_shape=vision, max_pixels=448 * 448,
                              dtype=None if shape in TINY.values() else torch.bfloat16)
    raw = os.path.join(work, "raw", "data")
    for split, count in (("train", images), ("test", 8)):
        rows = [{"images": [{"bytes": png_bytes(random_image(*IMAGE_SIZES[i % 4], seed=i)), "path": None}],
                 "problem": f"<image>Find x{i}.", "answer": str(i % 5)} for i in range(count)]
        write_parquet_atomic(rows, os.path.join(raw, f"{split}-00000-of-00001.parquet"))
    data_dir = os.path.join(work, "geo3k")
    subprocess.run([sys.executable, os.path.join(ROOT, "examples/data_preprocess/geo3k.py"), "--local_dataset_path",
                    os.path.dirname(raw), "--local_save_dir", data_dir], check=True)
    with open(os.path.join(work, "length_reward.py"), "w") as f:
        f.write("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                "    return len(solution_str) / 100\n")
    return model_dir, data_dir


def overrides(args, model_dir: str, data_dir: str, out_dir: str, reward: str) -> list[str]:
    per_gpu = args.prompts * args.n // args.gpus
    micro = max(1, min(8, per_gpu // 2))
    return [
        "algorithm.adv_estimator=grpo", f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet", "data.image_key=images", f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=1024", f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.model.use_remove_padding=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true", "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, args.prompts // 2)}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={micro}",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.freeze_vision_tower=true", f"actor_rollout_ref.rollout.name={args.engine}",
        f"actor_rollout_ref.rollout.n={args.n}", f"trainer.n_gpus_per_node={args.gpus}",
        f"trainer.total_training_steps={args.steps}", "trainer.val_before_train=false",
        "trainer.logger=[console,file]", f"trainer.output_dir={out_dir}", f"trainer.default_local_dir={out_dir}/ckpt",
        "trainer.progress_bar=false", f"trainer.on_policy_tolerance={ON_POLICY_TOLERANCE[args.shape]}",
        f"custom_reward_function.path={reward}",
        *(["trainer.device=cpu", "reward.num_workers=0"] if args.smoke else []), *args.extra,
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="2b", choices=list(SHAPES))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=16, help="data.train_batch_size")
    p.add_argument("--n", type=int, default=4, help="actor_rollout_ref.rollout.n")
    p.add_argument("--response-length", type=int, default=128)
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--engine", default="hf", choices=["hf", "vllm", "sglang"], help="actor_rollout_ref.rollout.name")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shape, 1 step of 4 prompts x 2 on 2 workers")
    p.add_argument("--extra", nargs="*", default=[], help="more key=value overrides")
    args = p.parse_args(argv)
    if args.smoke:
        args.shape = TINY[SHAPES[args.shape][0]]
        args.steps, args.prompts, args.n, args.response_length, args.gpus = 1, 4, 2, 8, 2
    work = tempfile.mkdtemp(prefix="vision_grpo_")
    model_dir, data_dir = prepare(work, args.shape, images=max(args.prompts * (args.steps + 1), 16))
    out_dir = os.path.join(work, "run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    rc = subprocess.run([sys.executable, "-m", "verlx.trainer.main_ppo",
                         *overrides(args, model_dir, data_dir, out_dir, os.path.join(work, "length_reward.py"))],
                        cwd=ROOT, env=env).returncode
    metrics = os.path.join(out_dir, "metrics.jsonl")
    rows = []
    if os.path.exists(metrics):
        with open(metrics) as f:
            rows = [json.loads(line) for line in f]
    print("\n| step | " + " | ".join(SHOWN) + " |\n" + "|---" * (len(SHOWN) + 1) + "|")
    for row in rows:
        cells = [f"{row[k]:.3g}" if isinstance(row.get(k), (int, float)) else "-" for k in SHOWN]
        print(f"| {row['step']} | " + " | ".join(cells) + " |")
    if os.environ.get("OUT") and rows:
        shutil.copy(metrics, os.path.join(os.environ["OUT"], f"vision_grpo_{args.shape}_{args.engine}.jsonl"))
    return rc if rows else (rc or 1)


if __name__ == "__main__":
    sys.exit(main())
