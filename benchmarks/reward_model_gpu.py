"""A model-based reward model (reward_model.enable, issue 23) on one GPU: its scores against the checkpoint's own
forward, then GRPO through main_ppo with it.

1. Exactness in bf16: the reward model built as RewardModelWorker builds it (fp32 master weights, FSDP2 with bf16
   compute on the GPU) scores 32 random sequences of 20-200 tokens; the checkpoint's own fp32 forward
   (AutoModelForTokenClassification, the last token's logit, as veRL's worker reads it) scores them one by one.
   Printed: the largest difference and the scores' spread (bf16 compute rounds; on CPU the two agree to 1e-5,
   tests/runtime/test_reward_model_worker.py).
2. grpo_step_gpu.py's run (Qwen2.5-0.5B-shaped policy, random weights) with a Qwen2.5-0.5B-shaped reward model
   (random weights, its own "role: content" chat template, so each chat is re-rendered) and veRL's profiler keys
   tracing the reward model's phase at step 2: timing_s/reward, perf/max_memory_allocated_gb/reward_model, the
   profile summary. Metrics and profiles are copied to $OUT.

  python benchmarks/reward_model_gpu.py                 # one GPU
  python benchmarks/reward_model_gpu.py --smoke         # CPU, tiny shapes: the pipeline runs
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import grpo_step_gpu  # noqa: E402

PLAIN_TEMPLATE = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
SHOWN = ("timing_s/step", "timing_s/reward", "perf/max_memory_allocated_gb/reward_model", "critic/score/mean",
         "critic/score/max", "critic/score/min")


def build_reward_model(out_dir: str, shape: str) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    from verlx.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(model_max_length=4096)
    tokenizer.chat_template = PLAIN_TEMPLATE
    config = Qwen2Config(**grpo_step_gpu.SHAPES[shape], max_position_embeddings=32768, tie_word_embeddings=False,
                         rope_theta=1000000.0, pad_token_id=tokenizer.pad_token_id, num_labels=1, dtype="bfloat16")
    torch.manual_seed(1)
    model = Qwen2ForSequenceClassification(config)
    torch.nn.init.normal_(model.score.weight, std=config.hidden_size ** -0.5)
    model.to(torch.bfloat16).save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def exactness(rm_dir: str, device_name: str) -> dict:
    """Part 1, in this process as a one-rank torch.distributed world."""
    import torch
    from transformers import AutoModelForTokenClassification

    from verlx.config.reward_model import RewardModelModelConfig
    from verlx.utils.distributed import free_port, init_distributed
    from verlx.workers.fsdp.model_builder import apply_fsdp2, load_score_model

    os.environ.update(RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    init_distributed()
    device = torch.device(device_name)
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, 200, (32,), generator=generator).tolist()
    sequences = [torch.randint(0, 256, (n,), generator=generator).tolist() for n in lengths]
    module = load_score_model(rm_dir, RewardModelModelConfig(path=rm_dir), torch.float32)
    apply_fsdp2(module.requires_grad_(False), device, torch.bfloat16)
    width = max(lengths)
    ids = torch.zeros((len(sequences), width), dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, seq in enumerate(sequences):
        ids[i, : len(seq)], mask[i, : len(seq)] = torch.tensor(seq), 1
    with torch.no_grad():
        ours = module(ids.to(device), mask.to(device), (mask.cumsum(-1) - 1).clamp(min=0).to(device)).cpu()
        reference = AutoModelForTokenClassification.from_pretrained(rm_dir, dtype=torch.float32).to(device).eval()
        direct = torch.tensor([reference(input_ids=torch.tensor([s], device=device)).logits[0, -1, 0].item()
                               for s in sequences])
    result = {"max_abs_diff": float((ours - direct).abs().max()), "score_std": float(direct.std()),
              "sequences": len(sequences), "device": device_name}
    print(f"\nreward model vs the checkpoint's fp32 forward: {result}")
    return result


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shapes, 2 steps")
    p.add_argument("--steps", type=int, default=3)
    args = p.parse_args(argv)
    work = tempfile.mkdtemp(prefix="verlx-rm-")
    run = grpo_step_gpu.parse_args(["--smoke"] if args.smoke else ["--steps", str(args.steps)])
    model_dir, data_dir = grpo_step_gpu.prepare_inputs(work, run.shape)
    rm_dir = os.path.join(work, "reward_model")
    build_reward_model(rm_dir, run.shape)
    out = os.environ.get("OUT") or work
    check = exactness(rm_dir, "cpu" if args.smoke else "cuda")
    profiles = os.path.join(out, "reward_model_profile")
    run.extra = ["reward_model.enable=true", f"reward_model.model.path={rm_dir}", "data.return_raw_chat=true",
                 "global_profiler.tool=torch", f"global_profiler.steps=[{min(2, run.steps)}]",
                 f"global_profiler.save_path={profiles}", "reward_model.profiler.enable=true"]
    result = grpo_step_gpu.run_once(run, model_dir, data_dir, work, "reward_model", {**os.environ})
    for row in result["rows"]:
        print({k: row.get(k) for k in ("step", *SHOWN)})
    grpo_step_gpu.profile_table(profiles)
    if result["rows"]:
        shutil.copy(result["metrics_path"], os.path.join(out, "reward_model_metrics.jsonl"))
    with open(os.path.join(out, "reward_model_exactness.json"), "w") as f:
        json.dump(check, f, indent=1)
    return result["rc"]


if __name__ == "__main__":
    sys.exit(main())
