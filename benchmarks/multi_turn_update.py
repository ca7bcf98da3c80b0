"""The actor update's cost per token: a multi-turn batch vs a single-turn batch of the same real-token count.

The two layouts are those of the GPU benchmarks: agent_loop_gpu.py (prompts rendered to 195 tokens, left-padded
to data.max_prompt_length=256; responses of 3 model turns of 64 tokens and 2 tool deltas of 24, right-padded to
336, response_mask 0 on the tool tokens) and grpo_step_gpu.py (prompts of 20-40 tokens padded to 64, 256 response
tokens, all trained). Both run `PPOActor.update_policy` on the trainer's FSDP2 engine (1-rank group,
remove-padding) with token-budget micro-batches (the workers' default) and with fixed 16-sample micro-batches (what
agent_loop_gpu.py passed before). Prints seconds, micro-batches and µs per real token for each; writes
$OUT/multi_turn_update.json.

  python benchmarks/multi_turn_update.py                      # GPU, 0.5B shape
  python benchmarks/multi_turn_update.py --device cpu --shape tiny --vocab 4096 --samples 32 --budget 2048 \
      --fixed-micro 1     # CPU, the GPU run's micro-batch counts scaled down 16×
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from verlx.protocol import DataProto  # noqa: E402

LAYOUTS = {  # prompt width, real prompt lengths, response width, segments (tokens, trained) of every response
    "multi_turn": (256, (195, 195), 336, ((64, 1), (24, 0), (64, 1), (24, 0), (64, 1))),
    "single_turn": (64, (20, 40), 256, ((256, 1),)),
}


def layout_batch(name: str, samples: int, vocab: int, seed: int = 0) -> DataProto:
    """`samples` rows of layout `name`: ids, masks, positions, old log-probs and advantages (0 off the mask)."""
    prompt_width, (lo, hi), width, segments = LAYOUTS[name]
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(lo, hi + 1, (samples,), generator=g)
    cols = torch.arange(prompt_width)
    prompt_mask = (cols >= prompt_width - prompt_lens[:, None]).long()
    trained = torch.cat([torch.full((n,), t) for n, t in segments])
    real = len(trained)
    response_valid = torch.zeros(samples, width, dtype=torch.long)
    response_valid[:, :real] = 1
    response_mask = torch.zeros(samples, width, dtype=torch.long)
    response_mask[:, :real] = trained
    ids = torch.randint(1, vocab, (samples, prompt_width + width), generator=g)
    mask = torch.cat([prompt_mask, response_valid], -1)
    prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    pos = torch.cat([prompt_pos, prompt_pos[:, -1:] + torch.arange(1, width + 1)], -1)
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, prompt_width:],
                      "response_mask": response_mask,
                      "old_log_probs": -torch.rand(samples, width, generator=g) * 5 * response_mask,
                      "advantages": torch.randn(samples, width, generator=g) * response_mask},
                     meta_info={"temperature": 1.0})


def samples_for_tokens(name: str, tokens: int) -> int:
    prompt_width, (lo, hi), width, segments = LAYOUTS[name]
    return max(2, round(tokens / ((lo + hi) / 2 + sum(n for n, _ in segments))))


def build_actor(args, micro: str):
    from grpo_step_gpu import SHAPES
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verlx.config.roles import ActorConfig
    from verlx.models.policy import PolicyModel
    from verlx.workers.actor import PPOActor
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import apply_fsdp2, build_optimizer, compile_for_training

    device = torch.device(args.device)
    shape = dict(SHAPES[args.shape], vocab_size=args.vocab)
    torch.manual_seed(0)
    with device:
        hf = Qwen2ForCausalLM(Qwen2Config(**shape, max_position_embeddings=32768, tie_word_embeddings=True))
    cfg = ActorConfig(ppo_mini_batch_size=1, use_dynamic_bsz=micro == "budget",  # the size comes with each call
                      ppo_max_token_len_per_gpu=args.budget, use_kl_loss=True, kl_loss_type="low_var_kl")
    cfg.optim.lr = 1e-6
    module = PolicyModel(hf, packed=True)
    compile_for_training(module, True, device)  # compiles on a GPU only, as in the workers
    apply_fsdp2(module, device, torch.bfloat16 if args.device == "cuda" else torch.float32)
    engine = FSDPEngine("actor", module, build_optimizer(module.parameters(), cfg.optim), device)
    return PPOActor(cfg, engine)


def micro_batch_count(actor, data: DataProto, mini: int, micro: int | None) -> int:
    from verlx.workers.micro_batching import ppo_mini_batches

    return sum(len(m.micro_batches) for m in ppo_mini_batches(data, actor.config, mini, micro, actor.engine.device,
                                                                key="actor"))


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(args, actor, data: DataProto, micro: int | None) -> tuple[list[float], list[float]]:
    """Wall seconds and this process's CPU seconds of each timed update (on a shared CPU the CPU time is the steadier
    measure of work: waiting for a core is not counted)."""
    mini = len(data) // 2  # two optimizer steps, as in both GPU benchmarks
    data.batch["ref_log_prob"] = data.batch["old_log_probs"].clone()
    wall, cpu = [], []
    for _ in range(args.warmup + args.repeats):
        sync(args.device)
        start, start_cpu = time.perf_counter(), time.process_time()
        actor.update_policy(data, mini, micro)
        sync(args.device)
        wall.append(time.perf_counter() - start)
        cpu.append(time.process_time() - start_cpu)
    return wall[args.warmup:], cpu[args.warmup:]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--shape", default="0.5b")
    p.add_argument("--vocab", type=int, default=151936)
    p.add_argument("--samples", type=int, default=512, help="multi-turn samples (the single-turn batch matches "
                   "their real-token count)")
    p.add_argument("--budget", type=int, default=32768, help="ppo_max_token_len_per_gpu of the budget mode")
    p.add_argument("--fixed-micro", type=int, default=16, help="samples per micro-batch of the fixed mode")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args(argv)
    from train_throughput import init_single_rank

    init_single_rank()
    multi = layout_batch("multi_turn", args.samples, args.vocab)
    tokens = int(multi.batch["attention_mask"].sum())
    batches = {"multi_turn": multi,
               "single_turn": layout_batch("single_turn", samples_for_tokens("single_turn", tokens), args.vocab, 1)}
    rows = []
    for micro_mode, micro in (("budget", None), (f"fixed{args.fixed_micro}", args.fixed_micro)):
        actor = build_actor(args, micro_mode)
        for name, data in batches.items():
            real = int(data.batch["attention_mask"].sum())
            wall, cpu = measure(args, actor, data, micro)
            row = {"layout": name, "micro_batches": micro_mode, "samples": len(data), "real_tokens": real,
                   "trained_tokens": int(data.batch["response_mask"].sum()),
                   "micro_batch_count": micro_batch_count(actor, data, len(data) // 2, micro),
                   "seconds": wall, "cpu_seconds": cpu, "median_s": statistics.median(wall),
                   "us_per_token": 1e6 * statistics.median(wall) / real,
                   "cpu_us_per_token": 1e6 * statistics.median(cpu) / real}
            rows.append(row)
            print(json.dumps(row), flush=True)
    print("\n| layout | micro-batches | samples | real tokens | micro-batch count | median s | µs / token | "
          "CPU µs / token |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['layout']} | {r['micro_batches']} | {r['samples']} | {r['real_tokens']} | "
              f"{r['micro_batch_count']} | {r['median_s']:.3f} | {r['us_per_token']:.2f} | "
              f"{r['cpu_us_per_token']:.2f} |")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "multi_turn_update.json"), "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
