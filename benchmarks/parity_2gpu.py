"""FSDP across 2 ranks and Ulysses SP=2 give the 1-GPU loss, log-probs and gradient norm on the same batch.

    torchrun --nproc_per_node=2 benchmarks/parity_2gpu.py                # 2 GPUs, nccl, Qwen2-0.5B shape, bf16
    torchrun --nproc_per_node=2 benchmarks/parity_2gpu.py --device cpu   # 2 gloo processes, tiny model, fp32

Rank 0 writes a random-weight Qwen2 checkpoint (bf16 safetensors, tied embeddings); every run loads it with the
trainer's own path (load_policy: packed remove-padding PolicyModel, fp32 master weights; apply_fsdp2: bf16
compute and fp32 gradient reduction on GPU; build_optimizer; PPOActor). One fixed batch of variable-length
prompts (left-padded) and responses (right-padded), with response masks, advantages and old log-probs near the
model's own, is scored three ways:
  1gpu   the whole batch on one rank: FSDP2 on a 1-rank mesh, as the trainer runs on one GPU. Both ranks run
         it, each on its own mesh; the actor's few default-group collectives (token counts, metric means) then
         sum identical values, which leaves them exact, so each rank computes the single-GPU numbers.
  fsdp2  data parallel: each rank half the batch (the dispatcher's contiguous chunks), FSDP2 over both ranks;
         the loss is the trainer's token mean over the global batch (global_counts), gradients reduce-scattered.
  sp2    Ulysses: both ranks the whole batch, each sequence split between them (sequence_parallel_group), FSDP2
         over both ranks with the gradient divisor of the dp size (1), as the worker sets it; the actor's config
         says ulysses_sequence_parallel_size=2 with half the token budget (veRL's per-GPU unit), so its
         micro-batches are the 1gpu run's.
For each: log-probs from PPOActor.compute_log_prob (gathered over ranks), then PPOActor.update_policy on the batch
as one mini-batch of token-budget micro-batches: actor/pg_loss and actor/grad_norm (after the reduction, before
clipping). Tolerances: fp32 (CPU) 1e-5 on everything; bf16 (GPU) |Δloss| ≤ 1e-2 (the loss is O(1)), mean |Δ
log-prob| ≤ 1e-2, max ≤ 0.15, grad-norm relative ≤ 2e-2. The runs only batch tokens differently, so bf16 (8-bit
mantissa, 2^-8 ≈ 0.4% relative) rounds each matmul output differently; a real fault (a wrong normalisation over
ranks, a misplaced sequence slice, a missing gradient reduction) moves the loss or grad norm by tens of percent
and log-probs by O(1). Prints a table; writes $OUT/parity_2gpu.json when OUT is set; exits 1 outside tolerance.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from verlx.protocol import DataProto

SHAPES = {
    "gpu": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
            "intermediate_size": 4864, "vocab_size": 151936},
    "cpu": {"hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 128, "vocab_size": 512},
}
BATCH = {"gpu": {"rows": 16, "prompt": 128, "response": 256, "max_tokens": 2048},
         "cpu": {"rows": 8, "prompt": 12, "response": 10, "max_tokens": 48}}
TOLERANCE = {
    "gpu": {"loss_abs": 1e-2, "logprob_mean_abs": 1e-2, "logprob_max_abs": 0.15, "grad_norm_rel": 2e-2},
    "cpu": {"loss_abs": 1e-5, "logprob_mean_abs": 1e-5, "logprob_max_abs": 1e-5, "grad_norm_rel": 1e-5},
}
RUNS = ("1gpu", "fsdp2", "sp2")


def write_checkpoint(path: str, kind: str) -> None:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[kind], max_position_embeddings=32768, tie_word_embeddings=True,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, dtype="bfloat16")
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)


def make_batch(kind: str) -> DataProto:
    """Prompts of 1/4 to full length, left-padded; responses of 1 to full length, right-padded; fixed seed."""
    b = BATCH[kind]
    rows, prompt, response = b["rows"], b["prompt"], b["response"]
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPES[kind]["vocab_size"], (rows, prompt + response), generator=g)
    p = torch.randint(max(1, prompt // 4), prompt + 1, (rows,), generator=g)
    r = torch.randint(1, response + 1, (rows,), generator=g)
    cols = torch.arange(prompt + response)
    mask = ((cols >= prompt - p[:, None]) & (cols < prompt + r[:, None])).long()
    rmask = mask[:, prompt:]
    advantages = torch.randn(rows, 1, generator=g) * rmask  # one outcome advantage per sequence, as GRPO's
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                      "responses": ids[:, prompt:], "response_mask": rmask, "advantages": advantages},
                     meta_info={"temperature": 1.0})


def actor_config(kind: str):
    from verlx.config.roles import ActorConfig

    cfg = ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=BATCH[kind]["max_tokens"],
                      loss_agg_mode="token-mean", grad_clip=1.0)
    cfg.optim.lr = 1e-6
    return cfg


def build_actor(path: str, kind: str, device: torch.device, mesh=None, sp_group=None, dp_size: int | None = None,
                cfg=None, compute_dtype: torch.dtype = torch.bfloat16, mixed_precision_on_cpu: bool = False):
    """The trainer's actor set-up: load_policy (packed), apply_fsdp2, build_optimizer, PPOActor; `cfg` an
    ActorConfig (default: actor_config(kind)); fp32 master weights computing in `compute_dtype` (on the CPU only
    with `mixed_precision_on_cpu`, else in fp32)."""
    from verlx.config.engine import ModelConfig
    from verlx.workers.actor import PPOActor
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import (
        apply_fsdp2,
        build_optimizer,
        load_policy,
    )

    model_cfg = ModelConfig(path=path, use_remove_padding=True, enable_gradient_checkpointing=False)
    module = load_policy(path, model_cfg, torch.float32, sp_group=sp_group)
    apply_fsdp2(module, device, compute_dtype, mesh=mesh, grad_divide_factor=dp_size if sp_group is not None else None,
                mixed_precision_on_cpu=mixed_precision_on_cpu)
    cfg = cfg or actor_config(kind)
    optimizer = build_optimizer(module.parameters(), cfg.optim)
    engine = FSDPEngine("actor", module, optimizer, device, grad_clip=cfg.grad_clip)
    return PPOActor(cfg, engine)


def score(actor, data: DataProto, mini_batch: int) -> tuple[torch.Tensor, dict]:
    """Log-probs (this rank's rows) before the update, then the update's metrics."""
    log_probs, _ = actor.compute_log_prob(data, None, True, actor.config.ppo_max_token_len_per_gpu)
    metrics = actor.update_policy(data, mini_batch, None)
    return log_probs.float().cpu(), metrics


def gather_rows(local: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Every rank's rows, in rank order (the dispatcher's chunks concatenated)."""
    parts = [torch.empty_like(local, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, local.to(device))
    return torch.cat(parts).cpu()


def compare(ref: dict, run: dict, mask: torch.Tensor, tol: dict) -> dict:
    diff = (run["log_probs"] - ref["log_probs"]).abs()[mask]
    out = {"loss_abs": abs(run["pg_loss"] - ref["pg_loss"]), "logprob_mean_abs": float(diff.mean()),
           "logprob_max_abs": float(diff.max()),
           "grad_norm_rel": abs(run["grad_norm"] - ref["grad_norm"]) / max(abs(ref["grad_norm"]), 1e-12)}
    out["ok"] = all(out[k] <= tol[k] for k in tol)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args()
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun --nproc_per_node=2 (see the docstring)")
    from torch.distributed.device_mesh import DeviceMesh

    from verlx.models.ulysses import check_ulysses, sequence_parallel_group
    from verlx.utils.distributed import init_distributed

    kind = "gpu" if args.device == "cuda" else "cpu"
    if kind == "gpu":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    if world != 2:
        raise SystemExit(f"needs exactly 2 ranks, got {world}")
    holder = [tempfile.mkdtemp(prefix="verlx-parity-") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    path = holder[0]
    if rank == 0:
        write_checkpoint(path, kind)
    dist.barrier()
    own_groups = [dist.new_group([r]) for r in range(world)]  # collective: every rank creates both
    own_mesh = DeviceMesh.from_group(own_groups[rank], device.type)
    data = make_batch(kind)
    mask = data.batch["response_mask"].bool()
    rows = len(data)
    results, timings = {}, {}

    start = time.perf_counter()
    actor = build_actor(path, kind, device, mesh=own_mesh)
    log_probs, _ = actor.compute_log_prob(data, None, True, BATCH[kind]["max_tokens"])
    log_probs = log_probs.float().cpu()
    # old log-probs near the model's own (ratios ≈ 1, a few clipped): rank 0's, so every run scores the same batch
    noise = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(2)) * 0.1
    old = ((log_probs + noise) * mask).to(device)
    dist.broadcast(old, src=0)
    data.batch["old_log_probs"] = old.cpu()
    metrics = actor.update_policy(data, rows, None)
    results["1gpu"] = {"log_probs": log_probs, "pg_loss": metrics["actor/pg_loss"],
                       "grad_norm": metrics["actor/grad_norm"]}
    timings["1gpu"] = time.perf_counter() - start

    start = time.perf_counter()
    actor = build_actor(path, kind, device)
    shard = data.chunk(world)[rank]
    log_probs, metrics = score(actor, shard, rows // world)
    results["fsdp2"] = {"log_probs": gather_rows(log_probs, device), "pg_loss": metrics["actor/pg_loss"],
                        "grad_norm": metrics["actor/grad_norm"]}
    timings["fsdp2"] = time.perf_counter() - start

    start = time.perf_counter()
    check_ulysses(actor.engine.module.config, world, world)
    del actor
    sp_group, _, dp_size = sequence_parallel_group(world)
    sp_cfg = dataclasses.replace(actor_config(kind), ulysses_sequence_parallel_size=world,
                                 ppo_max_token_len_per_gpu=BATCH[kind]["max_tokens"] // world)
    actor = build_actor(path, kind, device, sp_group=sp_group, dp_size=dp_size, cfg=sp_cfg)
    log_probs, metrics = score(actor, data, rows)
    both = gather_rows(log_probs[None], device)
    results["sp2"] = {"log_probs": both[0], "pg_loss": metrics["actor/pg_loss"],
                      "grad_norm": metrics["actor/grad_norm"], "ranks_agree": bool(torch.equal(both[0], both[1]))}
    timings["sp2"] = time.perf_counter() - start
    del actor

    tol = TOLERANCE[kind]
    checks = {name: compare(results["1gpu"], results[name], mask, tol) for name in RUNS[1:]}
    checks["sp2"]["ok"] = checks["sp2"]["ok"] and results["sp2"]["ranks_agree"]
    ok = all(c["ok"] for c in checks.values())
    if rank == 0:
        device_name = torch.cuda.get_device_name() if kind == "gpu" else "cpu"
        print(f"\n{world} × {device_name}, {kind} shape, {rows} sequences, {int(mask.sum())} response tokens, "
              f"{int(data.batch['attention_mask'].sum())} tokens in all")
        print("| run | pg_loss | grad_norm | |Δloss| | mean |Δ log-prob| | max |Δ log-prob| | grad-norm rel Δ | ok |")
        print("|---|---|---|---|---|---|---|---|")
        for name in RUNS:
            r, c = results[name], checks.get(name)
            cells = ([f"{c['loss_abs']:.3g}", f"{c['logprob_mean_abs']:.3g}", f"{c['logprob_max_abs']:.3g}",
                      f"{c['grad_norm_rel']:.3g}", str(c["ok"])] if c else ["-"] * 5)
            print(f"| {name} | {r['pg_loss']:.6g} | {r['grad_norm']:.6g} | " + " | ".join(cells) + " |")
        print("tolerances: " + ", ".join(f"{k} ≤ {v:g}" for k, v in tol.items())
              + f"; sp2 ranks agree: {results['sp2']['ranks_agree']}")
        print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in timings.items()))
        if os.environ.get("OUT"):
            summary = {name: {k: v for k, v in r.items() if k != "log_probs"} for name, r in results.items()}
            with open(os.path.join(os.environ["OUT"], "parity_2gpu.json"), "w") as f:
                json.dump({"device": device_name, "world_size": world, "shape": SHAPES[kind], "batch": BATCH[kind],
                           "tolerance": tol, "results": summary, "checks": checks, "timings_s": timings,
                           "ok": ok, "torch": torch.__version__}, f, indent=1)
        shutil.rmtree(path, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
