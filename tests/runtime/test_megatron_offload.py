"""Megatron offload (megatron.param_offload / grad_offload / optimizer_offload), 2 gloo processes on the CPU as the
GPU runs it: bf16 weights with fp32 main params in megatron's distributed optimizer (torch's Adam).

On a CPU-only run the engine ignores the flags (the model already lives in host memory), so these tests give the
engine an offloader with all three on: the mechanism is the same on any device (HostStash moves storages); what a
GPU adds (pinned buffers, the freed device memory) is measured by benchmarks/megatron_gpu.py --offload.

- TP=2: after offload every parameter storage (DDP's param buffer), gradient buffer, fp32 main param and Adam state
  tensor holds 0 bytes; a forward phase (on_device()) brings back the parameters only; an update phase
  (on_device(optimizer=True)) brings back the parameters and optimizer state bit for bit into the same tensors, and
  the gradient buffers zero-filled. The reference (no DDP, no optimizer) offloads its parameters the same way.
- PP=2: two updates with a forward phase between them, and a save/resume, with all three flags on, give exactly the
  weights and Adam state the same engine without offload gives.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from helpers.ppo_batches import ragged_ppo_batch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install 'verlx[megatron]')")


def _build(path: str, tp: int, pp: int, offload: bool, trainable: bool = True):
    """The actor (or, not trainable, the reference) as MegatronEngine.build makes it, with an offloader that has all
    three flags on when `offload` (for_config would switch them off on the CPU), offloaded as set-up leaves it."""
    from megatron.core import parallel_state as mpu
    from transformers import AutoTokenizer

    from verlx.config.engine import MegatronConfig, ModelConfig
    from verlx.config.roles import ActorConfig
    from verlx.models.hf_config import load_hf_config
    from verlx.workers.actor import PPOActor
    from verlx.workers.engine import ModelSpec
    from verlx.workers.megatron.engine import MegatronEngine
    from verlx.workers.megatron.offload import MegatronOffloader

    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    cfg = ActorConfig(strategy="megatron", grad_clip=1.0, ppo_micro_batch_size_per_gpu=4)
    cfg.optim.lr = 1e-3
    cfg.megatron = MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, dtype="bfloat16",
                                  use_transformer_engine="false", use_distributed_optimizer=True)
    hf_config = load_hf_config(path, False, {})
    placement = MegatronEngine.place({"actor_rollout_ref.actor": cfg}, hf_config, 2)
    spec = ModelSpec("actor" if trainable else "ref", path, ModelConfig(path=path, enable_gradient_checkpointing=False),
                     cfg, hf_config, torch.device("cpu"), total_steps=10, trainable=trainable,
                     tokenizer=AutoTokenizer.from_pretrained(path) if trainable else None)
    engine = MegatronEngine.build(spec, placement)
    if offload:
        engine.offloader = MegatronOffloader(spec.name, engine.runner.chunks, engine.runner.optimizer, spec.device,
                                             True, True, True)
        engine.offload()
    return PPOActor(cfg, engine)


def _data(seed: int):
    return ragged_ppo_batch(seed, rows=8, meta_info={"temperature": 1.0})


def _update(actor, seed: int) -> None:
    with actor.engine.on_device(optimizer=True, overlap=True):
        actor.update_policy(_data(seed), 8, 4)
    actor.engine.step_lr()


def _forward(actor) -> None:
    with actor.engine.on_device(overlap=True):
        actor.compute_log_prob(_data(7), 4, False, 0)


def _optimizer_tensors(engine) -> tuple[list, list]:
    """The main params, and each one's Adam state tensors by name (a loaded state dict orders its keys otherwise)."""
    params, state = [], []
    for part in engine.runner.optimizer.chained_optimizers:
        for group in part.optimizer.param_groups:
            for main in group["params"]:
                params.append(main)
                values = part.optimizer.state[main]
                state += [values[k] for k in sorted(values)]
    return params, state


def _snapshot(engine) -> dict:
    with engine.on_device(optimizer=True):
        params, state = _optimizer_tensors(engine)
        return {"weights": [p.detach().clone() for p in engine.runner.chunks[0].parameters()],
                "main": [p.detach().clone() for p in params], "state": [t.clone() for t in state],
                "lr": engine.lr()}


def _nbytes(tensors) -> list[int]:
    return [t.untyped_storage().nbytes() for t in tensors]


def _storages_tp2(path: str) -> dict:
    from verlx.workers.megatron.offload import grad_buffers

    actor = _build(path, 2, 1, offload=True)
    engine = actor.engine
    _update(actor, seed=1)
    chunks = engine.runner.chunks
    params, grads = list(chunks[0].parameters()), grad_buffers(chunks)
    main, state = _optimizer_tensors(engine)
    out = {"offloaded": {"params": _nbytes(params), "grads": _nbytes(grads), "main": _nbytes(main),
                         "state": _nbytes(state)}}
    with engine.on_device(optimizer=True):
        out["before"] = {"params": [p.detach().clone() for p in params], "main": [p.clone() for p in main],
                         "state": [t.clone() for t in state]}
        for grad in grads:
            grad.fill_(3.0)  # what an update leaves there; a load must not bring it back
    with engine.on_device():  # a forward phase: the parameters only
        out["forward"] = {"params": _nbytes(params), "grads": _nbytes(grads), "main": _nbytes(main),
                          "state": _nbytes(state)}
    with engine.on_device(optimizer=True):
        now_main, now_state = _optimizer_tensors(engine)
        out["same_objects"] = (all(a is b for a, b in zip(now_main, main, strict=True))
                               and all(a is b for a, b in zip(now_state, state, strict=True)))
        out["after"] = {"params": [p.detach().clone() for p in params], "main": [p.clone() for p in main],
                        "state": [t.clone() for t in state], "grads": [g.clone() for g in grads]}
    del actor
    ref = _build(path, 2, 1, offload=True, trainable=False)
    ref_params = list(ref.engine.chunks[0].parameters())
    out["ref_offloaded"] = _nbytes(ref_params)
    with ref.engine.on_device():
        out["ref_loaded"] = [p.clone() for p in ref_params]
    plain = _build(path, 2, 1, offload=False, trainable=False)
    out["ref_plain"] = [p.clone() for p in plain.engine.chunks[0].parameters()]
    return out


def _updates_pp2(path: str, root: str) -> dict:
    ckpt = os.path.join(root, "global_step_1", "actor")
    out = {}
    for name in ("plain", "offloaded"):
        actor = _build(path, 1, 2, offload=name == "offloaded")
        _update(actor, seed=1)
        out[f"{name}_1"] = _snapshot(actor.engine)
        if name == "offloaded":
            with actor.engine.on_device(optimizer=True):
                actor.engine.save_checkpoint(ckpt)
        _forward(actor)
        _update(actor, seed=2)
        out[f"{name}_2"] = _snapshot(actor.engine)
        del actor
    resumed = _build(path, 1, 2, offload=True)
    with resumed.engine.on_device(optimizer=True):
        resumed.engine.load_checkpoint(ckpt)
    out["resumed_1"] = _snapshot(resumed.engine)
    _update(resumed, seed=2)
    out["resumed_2"] = _snapshot(resumed.engine)
    return out


RUNS = {"storages_tp2": lambda path, tmp: _storages_tp2(path), "updates_pp2": _updates_pp2}


def _worker(rank: int, tmp: str, run: str) -> None:
    from helpers.megatron_cpu import two_gloo_ranks_with_tiny_qwen2

    with two_gloo_ranks_with_tiny_qwen2(rank, tmp) as path:
        result = RUNS[run](path, tmp)
    torch.save(result, os.path.join(tmp, f"rank{rank}.pt"))


def _spawn(run: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(tmp, run), nprocs=2)
        return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(2)]


def _assert_equal(a: list, b: list, what: str) -> None:
    assert len(a) == len(b) > 0, what
    for i, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.dtype == y.dtype and torch.equal(x, y), f"{what} {i}"


def test_megatron_offload_empties_device_storages_and_restores_them_bit_for_bit_at_tp2():
    for rank, out in enumerate(_spawn("storages_tp2")):
        offloaded, forward = out["offloaded"], out["forward"]
        assert all(len(offloaded[k]) > 0 for k in offloaded), rank
        assert all(n == 0 for sizes in offloaded.values() for n in sizes), (rank, offloaded)
        assert all(n > 0 for n in forward["params"]), rank
        assert all(n == 0 for k in ("grads", "main", "state") for n in forward[k]), (rank, forward)
        before, after = out["before"], out["after"]
        assert before["params"][0].dtype == torch.bfloat16 and before["main"][0].dtype == torch.float32, rank
        assert any(t.abs().sum() > 0 for t in before["state"] if t.dim() > 0), rank  # Adam moments after one step
        for key in ("params", "main", "state"):
            _assert_equal(before[key], after[key], f"rank {rank}: {key}")
        assert out["same_objects"], rank
        assert all(torch.equal(g, torch.zeros_like(g)) for g in after["grads"]), rank  # freed, not moved
        assert all(n == 0 for n in out["ref_offloaded"]), rank
        _assert_equal(out["ref_loaded"], out["ref_plain"], f"rank {rank}: reference parameters")


def test_megatron_update_forward_and_resume_with_all_offload_flags_equal_no_offload_at_pp2():
    for rank, out in enumerate(_spawn("updates_pp2")):
        for run in ("offloaded", "resumed"):
            for step in (1, 2):
                plain, other = out[f"plain_{step}"], out[f"{run}_{step}"]
                assert plain["lr"] == other["lr"], (rank, run, step)
                for key in ("weights", "main", "state"):
                    _assert_equal(plain[key], other[key], f"rank {rank}, {run} after update {step}: {key}")
        moved = [(a - b).abs().max() for a, b in zip(out["plain_2"]["main"], out["plain_1"]["main"], strict=True)]
        assert all(m > 0 for m in moved), rank  # the second update moved every main param


def test_megatron_offload_flags_are_ignored_with_one_warning_on_a_cpu_only_run(monkeypatch, caplog):
    from verlx.config.engine import MegatronConfig
    from verlx.workers.megatron import offload

    monkeypatch.setattr(offload, "_warned", set())
    cfg = MegatronConfig(param_offload=True, grad_offload=True, optimizer_offload=True)
    with caplog.at_level("WARNING", logger=offload.__name__):
        made = [offload.MegatronOffloader.for_config("actor", [], None, torch.device("cpu"), cfg) for _ in range(2)]
    assert all(not (m.param_offload or m.grad_offload or m.optimizer_offload) for m in made)
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and "ignored on a CPU-only run" in warnings[0], warnings
