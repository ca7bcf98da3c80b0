"""Megatron TP=2, PP=2 and an uneven PP=2 against the FSDP actor on one checkpoint and batch: log-probs, one update,
export.

    torchrun --nproc_per_node=2 benchmarks/megatron_parity.py                       # 2 GPUs, nccl, 0.5B shape, bf16
    torchrun --nproc_per_node=2 benchmarks/megatron_parity.py --device cpu          # 2 gloo processes, tiny, fp32
    torchrun --nproc_per_node=2 benchmarks/megatron_parity.py --device cpu --bf16   # the GPU's bf16 check, tiny
    ... --plant-fault half_lr_rank1 --layouts tp2    # a planted fault the check must catch (exits 1)

The checkpoint and the batch are parity_2gpu.py's (random Qwen2 weights with tied embeddings; variable-length
left-padded prompts and right-padded responses; old log-probs near the model's own, so some ratios clip).
  fsdp     the trainer's FSDP actor on one rank (each rank its own 1-rank mesh, parity_2gpu's "1gpu" run), fp32
           master weights computing in bf16 (fp32 in the CPU's fp32 mode): log-probs, one update with the whole
           batch as one mini-batch (pg_loss, grad_norm), log-probs after.
  fsdp32   bf16 only: the same actor computing in fp32 (same weights, batch and update), the reference that every
           bf16 run's rounding is measured against.
  tp2/pp2/pp2_uneven
           the megatron engine as the worker builds it (MegatronEngine.place + build: megatron DDP, the distributed
           optimizer, gradient clipping at 1, the lr schedule) with TP=2 or PP=2 over both ranks (pp2_uneven: the
           first stage holds one layer, override_transformer_config.num_layers_in_first_pipeline_stage=1), bf16
           weights with fp32 main params in the optimizer (fp32 in the CPU's fp32 mode): the same numbers.
  export   the TP=2 actor after its update: dist-checkpoint save, export_megatron_checkpoint (what
           `python -m verlx.model_merger merge --backend megatron` runs), the exported directory loaded by the FSDP
           actor: its log-probs equal megatron's.
Tolerances, against fsdp: before the update (log-probs), the loss and the gradient norm, the FSDP parity table's
(parity_2gpu.TOLERANCE): bf16 |Δloss| ≤ 1e-2, mean |Δ log-prob| ≤ 1e-2, max ≤ 0.15, grad-norm relative ≤ 2e-2;
fp32 1e-5, which in fp32 also bounds the log-probs after the update.
After the update in bf16 a fixed tolerance cannot tell numerics from a fault. The update is Adam's first step,
lr·g/(|g|+eps) ≈ lr·sign(g) for every weight: a weight whose gradient lies within bf16 rounding of zero steps +lr
or -lr depending on the rounding, a full-size step either way. So two correct bf16 computations move apart by a
fixed fraction of the update, with heavy tails: FSDP's own bf16 run against its fp32 run (CPU, hidden 896, vocab
151,936, 4 layers, lr 1e-4, an update moving the log-probs by 1.33) differs by mean 0.005 and max 0.020 before the
update and by mean 0.018 and max 2.25 after it; 2 × H100 gave megatron against FSDP mean 0.039, max 1.3 after an
update that moved the log-probs by 0.79. The check therefore measures that floor in the same run and bounds
megatron by it (docs/benchmarks.md has the measurements):
  err(run)   mean and max |run − fsdp32| over the response tokens, before and after the update;
  floor      err(fsdp) after the update: what FSDP's own bf16 rounding does to the same update;
  rho        max(1, mean err(run) / mean err(fsdp) before the update): how much more megatron's kernels round
             than FSDP's. The sign flips grow in number with the gradient's rounding noise and the log-prob error
             with their square root, so scaling the floor by rho over-covers;
  pass       mean err(run) ≤ K·rho·mean floor and max err(run) ≤ K·rho·max floor after the update, K = 3: room
             for one random realisation of the flips against another (correct megatron runs on the CPU, TP=2 and
             PP=2 at three shapes, came to at most 1.25·rho·floor in mean and in max).
The floor is a resolution: a fault shows when it moves the log-probs by more than K·rho·floor, and faults in the
update (a wrong learning rate, a shard that is not stepped, the bf16 weights not refreshed from the main params)
move them by a sizeable fraction of update_shift (mean |Δ| of fsdp's log-probs over its update). The floor check
fails when K·floor exceeds half of update_shift (the comparison would say nothing). `--plant-fault` plants one
fault on rank 1 (TP rank 1 at TP=2, the last stage at PP=2): half its learning rate (only the after-update check
sees it), its gradients doubled (a loss scaled by 2 there: the gradient norm sees it) or dropped.
On the CPU megatron-core runs through the test suite's CUDA-as-CPU shim (tests/helpers/megatron_cpu.py), bf16
with fp32 main params, the distributed optimizer and clipping included. Prints each check as it completes and a
table; writes $OUT/megatron_parity.json when OUT is set; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
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

# (tp, pp, layers on the first pipeline stage or None for an even split); tp2 last: its updated weights are exported
LAYOUTS = {"pp2": (1, 2, None), "pp2_uneven": (1, 2, 1), "tp2": (2, 1, None)}
LR = 1e-4  # one Adam step moves every weight by ~lr: about one bf16 step of a 0.02-sized weight
FLOOR_MULTIPLE = 3.0  # K in the docstring
FAULTS = ("half_lr_rank1", "double_grads_rank1", "drop_grads_rank1")


def role_config(kind: str, bf16: bool, megatron: tuple[int, int, int | None] | None = None):
    """The actor config of every run: token-budget micro-batches, gradient clipping at 1, no weight decay (megatron
    exempts norms and biases, torch's AdamW does not)."""
    from verlx.config.engine import MegatronConfig

    cfg = fsdp_parity.actor_config(kind)
    cfg.optim.lr, cfg.optim.weight_decay, cfg.grad_clip = LR, 0.0, 1.0
    if megatron:
        tp, pp, first_stage_layers = megatron
        cfg.strategy = "megatron"
        uneven = {} if first_stage_layers is None else {"num_layers_in_first_pipeline_stage": first_stage_layers}
        cfg.megatron = MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
                                      dtype="bfloat16" if bf16 else "float32", use_transformer_engine="false",
                                      use_distributed_optimizer=True, override_transformer_config=uneven)
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


def build_megatron_actor(path: str, kind: str, bf16: bool, layout: tuple[int, int, int | None],
                         device: torch.device):
    from megatron.core import parallel_state as mpu

    from verlx.config.engine import ModelConfig
    from verlx.models.hf_config import load_hf_config
    from verlx.workers.actor import PPOActor
    from verlx.workers.engine import ModelSpec
    from verlx.workers.megatron.engine import MegatronEngine

    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    cfg = role_config(kind, bf16, layout)
    hf_config = load_hf_config(path, False, {})
    placement = MegatronEngine.place({"actor_rollout_ref.actor": cfg}, hf_config, dist.get_world_size())
    spec = ModelSpec("actor", path, ModelConfig(path=path, enable_gradient_checkpointing=False), cfg, hf_config,
                     device)
    return PPOActor(cfg, MegatronEngine.build(spec, placement)), hf_config


def plant_fault(engine, fault: str | None) -> None:
    """A fault on rank 1 for the check to catch: its learning rate halved, or its gradients (megatron's grad
    buffers, after the backward and before the optimizer step) doubled or zeroed."""
    if fault is None or dist.get_rank() != 1:
        return
    runner = engine.runner
    if fault == "half_lr_rank1":
        for group in runner.optimizer.param_groups:
            group["lr"] *= 0.5
        return
    factor = {"double_grads_rank1": 2.0, "drop_grads_rank1": 0.0}[fault]
    step = runner.step

    def faulty_step(metrics):
        for chunk in runner.chunks:
            for buffer in chunk.buffers:
                buffer.grad_data.mul_(factor)
        step(metrics)

    runner.step = faulty_step


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


def abs_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> tuple[float, float]:
    """Mean and max |a − b| over the response tokens."""
    diff = (a - b).abs()[mask]
    return float(diff.mean()), float(diff.max())


def logprob_gap(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor, tol: dict) -> dict:
    mean, worst = abs_gap(a, b, mask)
    out = {"logprob_mean_abs": mean, "logprob_max_abs": worst}
    out["ok"] = all(out[k] <= tol[k] for k in out)
    return out


def noise_floor(runs: dict, mask: torch.Tensor, shift: float) -> dict:
    """FSDP's own bf16 rounding against its fp32 run, before and after the update (see the docstring)."""
    before, _ = abs_gap(runs["fsdp"]["before"], runs["fsdp32"]["before"], mask)
    after_mean, after_max = abs_gap(runs["fsdp"]["log_probs"], runs["fsdp32"]["log_probs"], mask)
    resolution = FLOOR_MULTIPLE * after_mean / shift
    return {"before_mean": before, "after_mean": after_mean, "after_max": after_max, "resolution": resolution,
            "ok": before > 0 and after_mean > 0 and resolution <= 0.5}


def update_check(runs: dict, name: str, mask: torch.Tensor, tol: dict, floor: dict | None) -> dict:
    """The loss and gradient norm against fsdp's; the log-probs after the update against fsdp's (fp32) or against
    the noise floor (bf16)."""
    run, ref = runs[name], runs["fsdp"]
    out = {"loss_abs": abs(run["pg_loss"] - ref["pg_loss"]),
           "grad_norm_rel": abs(run["grad_norm"] - ref["grad_norm"]) / max(abs(ref["grad_norm"]), 1e-12)}
    out["logprob_mean_abs"], out["logprob_max_abs"] = abs_gap(run["log_probs"], ref["log_probs"], mask)
    ok = all(out[k] <= tol[k] for k in ("loss_abs", "grad_norm_rel"))
    if floor is None:
        ok = ok and out["logprob_mean_abs"] <= tol["logprob_mean_abs"] and out["logprob_max_abs"] <= tol[
            "logprob_max_abs"]
    else:
        err_before, _ = abs_gap(run["before"], runs["fsdp32"]["before"], mask)
        rho = max(1.0, err_before / floor["before_mean"]) if floor["before_mean"] > 0 else math.inf
        out["err_mean"], out["err_max"] = abs_gap(run["log_probs"], runs["fsdp32"]["log_probs"], mask)
        out["rho"] = rho
        out["bound_mean"] = FLOOR_MULTIPLE * rho * floor["after_mean"]
        out["bound_max"] = FLOOR_MULTIPLE * rho * floor["after_max"]
        ok = ok and out["err_mean"] <= out["bound_mean"] and out["err_max"] <= out["bound_max"]
    out["ok"] = ok
    return out


def report(checks: dict, name: str, result: dict, rank: int) -> None:
    """Record a check and print it at once, so a later failure does not hide the earlier results."""
    checks[name] = result
    if rank == 0:
        print("CHECK " + name + " " + json.dumps(result), flush=True)


def build_fsdp(path: str, kind: str, bf16: bool, device: torch.device, mesh, fp32: bool = False):
    """The FSDP actor on `mesh`, computing in bf16 when `bf16` (also on the CPU) unless `fp32`."""
    dtype = torch.float32 if fp32 else torch.bfloat16
    return fsdp_parity.build_actor(path, kind, device, mesh=mesh, cfg=role_config(kind, bf16), compute_dtype=dtype,
                                   mixed_precision_on_cpu=bf16 and not fp32)


def fsdp_references(path: str, data, kind: str, bf16: bool, device: torch.device) -> tuple[dict, object]:
    """fsdp (and fsdp32 in bf16) on each rank alone; old log-probs (rank 0's plus fixed noise) go into `data` first.
    Returns the runs and this rank's 1-rank mesh."""
    from torch.distributed.device_mesh import DeviceMesh

    rank = dist.get_rank()
    own_groups = [dist.new_group([r]) for r in range(dist.get_world_size())]  # collective: every rank makes all
    mesh = DeviceMesh.from_group(own_groups[rank], device.type)
    actor = build_fsdp(path, kind, bf16, device, mesh)
    budget = fsdp_parity.BATCH[kind]["max_tokens"]
    log_probs = actor.compute_log_prob(data, None, True, budget)[0].float().cpu()
    mask = data.batch["response_mask"].bool()
    noise = torch.randn(log_probs.shape, generator=torch.Generator().manual_seed(2)) * 0.1
    old = ((log_probs + noise) * mask).to(device)
    dist.broadcast(old, src=0)
    data.batch["old_log_probs"] = old.cpu()
    runs = {"fsdp": score(actor, data, kind, device)}
    del actor
    if bf16:
        runs["fsdp32"] = score(build_fsdp(path, kind, bf16, device, mesh, fp32=True), data, kind, device)
    return runs, mesh


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--bf16", action="store_true", help="on the CPU: compute in bf16, checked as on the GPU (the GPU "
                   "always computes in bf16)")
    p.add_argument("--layouts", nargs="+", choices=tuple(LAYOUTS), default=list(LAYOUTS),
                   help="megatron layouts to run (the export check runs with tp2)")
    p.add_argument("--plant-fault", choices=FAULTS, default=None,
                   help="plant a fault on rank 1 in the megatron runs, to see the checks catch it (exits 1)")
    args = p.parse_args()
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun --nproc_per_node=2 (see the docstring)")
    return args


def setup_device(args) -> tuple[str, torch.device]:
    from verlx.utils.distributed import init_distributed

    kind = "gpu" if args.device == "cuda" else "cpu"
    if kind == "gpu":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
        torch.set_num_threads(1)
    init_distributed()
    if dist.get_world_size() != 2:
        raise SystemExit(f"needs exactly 2 ranks, got {dist.get_world_size()}")
    return kind, device


def export_check(actor, hf_config, root: str, data, kind: str, bf16: bool, device, mesh, tp2_after, tol) -> dict:
    """The updated TP=2 actor saved, exported to HF and loaded by the FSDP actor: megatron's log-probs."""
    from verlx.workers.megatron.checkpoint import MegatronCheckpointManager, export_megatron_checkpoint

    ckpt, exported = os.path.join(root, "ckpt", "actor"), os.path.join(root, "exported")
    engine = actor.engine
    with megatron_device(kind):
        MegatronCheckpointManager(engine.runner.chunks, engine.runner.optimizer, engine.lr_scheduler, None,
                                  hf_config).save(ckpt)
    if dist.get_rank() == 0:
        export_megatron_checkpoint(ckpt, exported)
    dist.barrier()
    reloaded = build_fsdp(exported, kind, bf16, device, mesh)
    lp = reloaded.compute_log_prob(data, None, True, fsdp_parity.BATCH[kind]["max_tokens"])[0].float().cpu()
    return logprob_gap(lp, tp2_after, data.batch["response_mask"].bool(), tol)


def main() -> int:
    args = parse_args()
    kind, device = setup_device(args)
    bf16 = kind == "gpu" or args.bf16
    rank = dist.get_rank()
    holder = [tempfile.mkdtemp(prefix="verlx-megatron-parity-") if rank == 0 else None]
    dist.broadcast_object_list(holder, src=0)
    root = holder[0]
    path = os.path.join(root, "hf")
    if rank == 0:
        fsdp_parity.write_checkpoint(path, kind)
    dist.barrier()
    tol = fsdp_parity.TOLERANCE["gpu" if bf16 else "cpu"]
    data = fsdp_parity.make_batch(kind)
    mask = data.batch["response_mask"].bool()
    checks: dict = {}

    runs, mesh = fsdp_references(path, data, kind, bf16, device)
    shift, _ = abs_gap(runs["fsdp"]["log_probs"], runs["fsdp"]["before"], mask)
    floor = noise_floor(runs, mask, shift) if bf16 else None
    if floor is not None:
        report(checks, "noise_floor", floor, rank)
    for name in (n for n in LAYOUTS if n in args.layouts):
        with megatron_device(kind):
            actor, hf_config = build_megatron_actor(path, kind, bf16, LAYOUTS[name], device)
            plant_fault(actor.engine, args.plant_fault)
            runs[name] = score(actor, data, kind, device)
        report(checks, f"{name}_logprob", logprob_gap(runs[name]["before"], runs["fsdp"]["before"], mask, tol), rank)
        update = update_check(runs, name, mask, tol, floor)
        report(checks, f"{name}_update", {**update, "pg_loss": runs[name]["pg_loss"],
                                          "grad_norm": runs[name]["grad_norm"], "update_shift": shift}, rank)
    if "tp2" in args.layouts:
        report(checks, "export_reload", export_check(actor, hf_config, root, data, kind, bf16, device, mesh,
                                                     runs["tp2"]["log_probs"], tol), rank)

    ok = all(c["ok"] for c in checks.values())
    if rank == 0:
        summarize(runs, checks, tol, kind, bf16, shift, floor, args.plant_fault, ok)
        shutil.rmtree(root, ignore_errors=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


def summarize(runs: dict, checks: dict, tol: dict, kind: str, bf16: bool, shift: float, floor: dict | None,
              fault: str | None, ok: bool) -> None:
    device_name = torch.cuda.get_device_name() if kind == "gpu" else "cpu"
    precision = "bf16" if bf16 else "fp32"
    print(f"\n2 × {device_name}, {kind} shape, {precision}; tolerances: "
          + ", ".join(f"{k} ≤ {v:g}" for k, v in tol.items()) + (f"; planted fault: {fault}" if fault else ""))
    print(f"the FSDP update moved the log-probs by {shift:.3g} (mean |Δ|)")
    if floor is not None:
        print(f"noise floor (fsdp bf16 against fsdp32 after the update): mean {floor['after_mean']:.3g}, max "
              f"{floor['after_max']:.3g}; after-update bound: {FLOOR_MULTIPLE:g} × rho × floor")
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
            json.dump({"device": device_name, "shape": fsdp_parity.SHAPES[kind], "precision": precision,
                       "tolerance": tol, "floor_multiple": FLOOR_MULTIPLE, "noise_floor": floor,
                       "plant_fault": fault, "runs": summary, "checks": checks, "update_shift": shift, "ok": ok,
                       "torch": torch.__version__, "megatron_core": megatron.core.__version__}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
