"""Megatron TP=2 and PP=2 against the FSDP actor on one checkpoint and batch: log-probs, one update, export.

    torchrun --nproc_per_node=2 benchmarks/megatron_parity.py                # 2 GPUs, nccl, Qwen2-0.5B shape, bf16
    torchrun --nproc_per_node=2 benchmarks/megatron_parity.py --device cpu   # 2 gloo processes, tiny shape, fp32

The checkpoint and the batch are parity_2gpu.py's (random Qwen2 weights with tied embeddings; variable-length
left-padded prompts and right-padded responses; old log-probs near the model's own, so some ratios clip).
  fsdp     the trainer's FSDP actor on one rank (each rank its own 1-rank mesh, parity_2gpu's "1gpu" run):
           log-probs, one update with the whole batch as one mini-batch (pg_loss, grad_norm), log-probs after.
  tp2/pp2  the megatron engine as the worker builds it (MegatronEngine.place + build: megatron DDP, on the GPU the
           distributed optimizer, the lr schedule) with TP=2 or PP=2 over both ranks: the same numbers.
  export   the TP=2 actor after its update: dist-checkpoint save, export_megatron_checkpoint (what
           `python -m verlx.model_merger merge --backend megatron` runs), the exported directory loaded by the FSDP
           actor: its log-probs equal megatron's.
Tolerances are the FSDP parity table's (docs/benchmarks.md, parity_2gpu.TOLERANCE): bf16 |Δloss| ≤ 1e-2, mean
|Δ log-prob| ≤ 1e-2, max ≤ 0.15, grad-norm relative ≤ 2e-2; fp32 on the CPU 1e-5. `update_shift` (mean |Δ| of the
FSDP log-probs over its update) shows how far the update moved them, for the after-update parity to mean something.
On the CPU megatron-core runs through the test suite's CUDA-as-CPU shim (tests/helpers/megatron_cpu.py), without
gradient clipping and the distributed optimizer (both CUDA-only there). Prints each check as it completes and a
table; writes $OUT/megatron_parity.json when OUT is set; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

import parity_2gpu as fsdp_parity  # noqa: E402

LAYOUTS = {"pp2": (1, 2), "tp2": (2, 1)}  # tp2 last: its updated weights are exported
LR = 1e-4  # one Adam step moves every weight by ~lr: about one bf16 step of a 0.02-sized weight


def role_config(kind: str, megatron: tuple[int, int] | None = None):
    """The actor config of every run: token-budget micro-batches, no weight decay (megatron exempts norms and
    biases, torch's AdamW does not), gradient clipping at 1 on the GPU and none on the CPU."""
    from verlx.config.engine import MegatronConfig

    cfg = fsdp_parity.actor_config(kind)
    cfg.optim.lr, cfg.optim.weight_decay = LR, 0.0
    cfg.grad_clip = 1.0 if kind == "gpu" else (0.0 if megatron else 1e9)
    if megatron:
        tp, pp = megatron
        cfg.strategy = "megatron"
        cfg.megatron = MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                      dtype="bfloat16" if kind == "gpu" else "float32",
                                      use_transformer_engine="false", use_distributed_optimizer=kind == "gpu")
    return cfg


@contextlib.contextmanager
def megatron_device(kind: str):
    if kind == "gpu":
        yield
        return
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    import pytest

    from helpers.megatron_cpu import cuda_as_cpu

    with pytest.MonkeyPatch.context() as monkeypatch, cuda_as_cpu(monkeypatch):
        yield


def build_megatron_actor(path: str, kind: str, layout: tuple[int, int], device: torch.device):
    from megatron.core import parallel_state as mpu

    from verlx.config.engine import ModelConfig
    from verlx.models.hf_config import load_hf_config
    from verlx.workers.actor import PPOActor
    from verlx.workers.engine import ModelSpec
    from verlx.workers.megatron.engine import MegatronEngine

    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    cfg = role_config(kind, layout)
    hf_config = load_hf_config(path, False, {})
    placement = MegatronEngine.place({"actor_rollout_ref.actor": cfg}, hf_config, dist.get_world_size())
    spec = ModelSpec("actor", path, ModelConfig(path=path, enable_gradient_checkpointing=False), cfg, hf_config,
                     device)
    return PPOActor(cfg, MegatronEngine.build(spec, placement)), hf_config


def last_rank_rows(log_probs: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The last pipeline stage's rows on every rank (ranks are tp-fastest: the last stage holds the last rank)."""
    log_probs = log_probs.float().to(device).contiguous()
    dist.broadcast(log_probs, src=dist.get_world_size() - 1)
    return log_probs.cpu()


def last_rank_metrics(metrics: dict) -> dict:
    holder = [metrics]  # metrics live on the last pipeline stage
    dist.broadcast_object_list(holder, src=dist.get_world_size() - 1)
    return holder[0]


def score(actor, data, kind: str, device: torch.device) -> dict:
    """Log-probs, one update of the whole batch as one mini-batch, log-probs after it."""
    budget = fsdp_parity.BATCH[kind]["max_tokens"]
    start = time.perf_counter()
    before = last_rank_rows(actor.compute_log_prob(data, None, True, budget)[0], device)
    metrics = last_rank_metrics(actor.update_policy(data, len(data), None))
    after = last_rank_rows(actor.compute_log_prob(data, None, True, budget)[0], device)
    return {"before": before, "log_probs": after, "pg_loss": metrics["actor/pg_loss"],
            "grad_norm": metrics["actor/grad_norm"], "seconds": time.perf_counter() - start}


def logprob_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, tol: dict) -> dict:
    diff = (a - b).abs()[mask]
    out = {"logprob_mean_abs": float(diff.mean()), "logprob_max_abs": float(diff.max())}
    out["ok"] = all(out[k] <= tol[k] for k in out)
    return out


def report(checks: dict, name: str, result: dict, rank: int) -> None:
    """Record a check and print it at once, so a later failure does not hide the earlier results."""
    checks[name] = result
    if rank == 0:
        print("CHECK " + name + " " + json.dumps(result), flush=True)


def fsdp_reference(path: str, data, kind: str, device: torch.device, rank: int):
    """The FSDP actor on this rank alone; old log-probs (rank 0's plus fixed noise) written into `data`."""
    from torch.distributed.device_mesh import DeviceMesh

    own_groups = [dist.new_group([r]) for r in range(dist.get_world_size())]  # collective: every rank makes all
    mesh = DeviceMesh.from_group(own_groups[rank], device.type)
    actor = fsdp_parity.build_actor(path, kind, device, mesh=mesh, cfg=role_config(kind))
    budget = fsdp_parity.BATCH[kind]["max_tokens"]
    log_probs = actor.compute_log_prob(data, None, True, budget)[0].float().cpu()
    mask = data.batch["response_mask"].bool()
    noise = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(2)) * 0.1
    old = ((log_probs + noise) * mask).to(device)
    dist.broadcast(old, src=0)
    data.batch["old_log_probs"] = old.cpu()
    return actor, mesh


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    args = p.parse_args()
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun --nproc_per_node=2 (see the docstring)")
    from verlx.utils.distributed import init_distributed

    kind = "gpu" if args.device == "cuda" else "cpu"
    if kind == "gpu":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    init_distributed()
    rank = dist.get_rank()
    if dist.get_world_size() != 2:
        raise SystemExit(f"needs exactly 2 ranks, got {dist.get_world_size()}")
    holder = [tempfile.mkdtemp(prefix="verlx-megatron-parity-") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    root = holder[0]
    path = os.path.join(root, "hf")
    if rank == 0:
        fsdp_parity.write_checkpoint(path, kind)
    dist.barrier()
    tol = fsdp_parity.TOLERANCE[kind]
    data = fsdp_parity.make_batch(kind)
    mask = data.batch["response_mask"].bool()
    checks: dict = {}

    actor, mesh = fsdp_reference(path, data, kind, device, rank)
    runs = {"fsdp": score(actor, data, kind, device)}
    del actor
    shift = float((runs["fsdp"]["log_probs"] - runs["fsdp"]["before"]).abs()[mask].mean())
    for name, layout in LAYOUTS.items():
        with megatron_device(kind):
            actor, hf_config = build_megatron_actor(path, kind, layout, device)
            runs[name] = score(actor, data, kind, device)
        report(checks, f"{name}_logprob", logprob_gap(runs[name]["before"], runs["fsdp"]["before"], mask, tol), rank)
        update = fsdp_parity.compare(runs["fsdp"], runs[name], mask, tol)
        report(checks, f"{name}_update", {**update, "pg_loss": runs[name]["pg_loss"],
                                          "grad_norm": runs[name]["grad_norm"], "update_shift": shift}, rank)

    from verlx.workers.megatron.checkpoint import MegatronCheckpointManager, export_megatron_checkpoint

    ckpt, exported = os.path.join(root, "ckpt", "actor"), os.path.join(root, "exported")
    engine = actor.engine
    with megatron_device(kind):
        MegatronCheckpointManager(engine.runner.chunks, engine.runner.optimizer, engine.lr_scheduler, None,
                                  hf_config).save(ckpt)
    if rank == 0:
        export_megatron_checkpoint(ckpt, exported)
    dist.barrier()
    reloaded = fsdp_parity.build_actor(exported, kind, device, mesh=mesh, cfg=role_config(kind))
    lp = reloaded.compute_log_prob(data, None, True, fsdp_parity.BATCH[kind]["max_tokens"])[0].float().cpu()
    report(checks, "export_reload", logprob_gap(lp, runs["tp2"]["log_probs"], mask, tol), rank)

    ok = all(c["ok"] for c in checks.values())
    if rank == 0:
        summarize(runs, checks, tol, kind, shift, ok)
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def summarize(runs: dict, checks: dict, tol: dict, kind: str, shift: float, ok: bool) -> None:
    device_name = torch.cuda.get_device_name() if kind == "gpu" else "cpu"
    print(f"\n2 × {device_name}, {kind} shape; tolerances: " + ", ".join(f"{k} ≤ {v:g}" for k, v in tol.items()))
    print(f"the FSDP update moved the log-probs by {shift:.3g} (mean |Δ|)")
    print("| check | ok | details |\n|---|---|---|")
    for name, res in checks.items():
        details = ", ".join(f"{k}={v:.3g}" for k, v in res.items() if k != "ok")
        print(f"| {name} | {res['ok']} | {details} |")
    print("| run | pg_loss | grad_norm | seconds |\n|---|---|---|---|")
    for name, r in runs.items():
        print(f"| {name} | {r['pg_loss']:.6g} | {r['grad_norm']:.6g} | {r['seconds']:.1f} |")
    if os.environ.get("OUT"):
        import megatron.core

        summary = {name: {k: v for k, v in r.items() if k not in ("log_probs", "before")} for name, r in runs.items()}
        with open(os.path.join(os.environ["OUT"], "megatron_parity.json"), "w") as f:
            json.dump({"device": device_name, "shape": fsdp_parity.SHAPES[kind], "tolerance": tol, "runs": summary,
                       "checks": checks, "update_shift": shift, "ok": ok, "torch": torch.__version__,
                       "megatron_core": megatron.core.__version__}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
