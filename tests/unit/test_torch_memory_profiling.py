"""veRL's torch_memory profiler keys (global_profiler.tool=torch_memory) on verlx: the config they compose into, the
refusals before Ray, and the memory-history calls a worker makes around the recorded phase calls, with the snapshot
written even when the phase fails (CPU: torch.cuda.memory's history and snapshot calls are recorded, not run — a
GPU run writes real snapshots, docs/benchmarks.md)."""

from __future__ import annotations

import os
import pickle

import pytest
import torch
from test_profile_plan import config_from

from verlx.config.loader import ConfigError
from verlx.trainer.preflight import validate
from verlx.workers import profiling
from verlx.workers.perf import PhaseTimer
from verlx.workers.profile_plan import MemoryHistory, profile_plan, profiler_notes

CPU = torch.device("cpu")
# veRL's keys for memory snapshots of the actor, with its global settings changed
MEMORY_KEYS = ["global_profiler.tool=torch_memory", "global_profiler.steps=[2]",
               "actor_rollout_ref.actor.profiler.enable=True",
               "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries=5000",
               "global_profiler.global_tool_config.torch_memory.context=alloc",
               "global_profiler.global_tool_config.torch_memory.stacks=python",
               "+global_profiler.global_tool_config.torch_memory.kw_args.clear_history=true"]


def test_verls_torch_memory_keys_compose_into_a_plan_of_memory_snapshots(tmp_path):
    cfg = config_from(*MEMORY_KEYS, f"global_profiler.save_path={tmp_path}")
    assert cfg.actor_rollout_ref.actor.profiler.tool_config.torch_memory.trace_alloc_max_entries == 5000  # follows
    plan = profile_plan(cfg)
    assert sorted(plan.phases) == ["actor", "actor_infer"] and plan.steps == {2}
    assert {(r.tool, r.directory, r.memory) for r in plan.phases.values()} == {
        ("torch_memory", str(tmp_path), MemoryHistory(5000, "alloc", "python", (("clear_history", True),)))}
    notes = profiler_notes(cfg)
    assert notes[0] == (f"profiler keys → torch's CUDA memory history: actor_infer (ranks [0]), actor (ranks [0]) at "
                        f"steps [2], recorded during each such phase call and written as a snapshot into {tmp_path} as "
                        "<phase>_step<N>_rank<R>.pickle (also when the call fails, an out-of-memory error included; "
                        "open it in https://pytorch.org/memory_viz)")
    assert notes[1].startswith("profiler tool_config.torch_memory.stack_depth is not used")
    several = profiler_notes(config_from(*MEMORY_KEYS,
                                         "global_profiler.global_tool_config.torch_memory.memory_snapshot_num_steps=2"))
    assert "verlx writes one snapshot per phase call and step" in several[1]


def test_torch_memory_is_refused_before_ray_off_cuda_or_with_settings_torch_lacks():
    validate(config_from(*MEMORY_KEYS, "trainer.device=cuda"), check_files=False)
    with pytest.raises(ConfigError, match=r"global_profiler.tool=torch_memory with trainer.device=cpu: torch's memory "
                                          r"history records the CUDA caching allocator; .*or set "
                                          r"global_profiler.tool=torch"):
        validate(config_from(*MEMORY_KEYS, "trainer.device=cpu"), check_files=False)
    with pytest.raises(ConfigError, match=r"global_profiler.global_tool_config.torch_memory.stacks='cpp': torch "
                                          r"records python or all stacks"):
        validate(config_from(*MEMORY_KEYS, "trainer.device=cuda",
                             "global_profiler.global_tool_config.torch_memory.stacks=cpp"), check_files=False)
    with pytest.raises(ConfigError, match=r"actor_rollout_ref.actor.profiler.tool_config.torch_memory."
                                          r"trace_alloc_max_entries=0: the history keeps at least one allocation"):
        validate(config_from(*MEMORY_KEYS, "trainer.device=cuda",
                             "actor_rollout_ref.actor.profiler.tool_config.torch_memory.trace_alloc_max_entries=0"),
                 check_files=False)
    with pytest.raises(ConfigError, match=r"global_profiler.tool=npu: verlx profiles with torch, nsys, torch_memory"):
        validate(config_from(*MEMORY_KEYS, "global_profiler.tool=npu"), check_files=False)


@pytest.fixture
def recorded_memory_calls(monkeypatch):
    """torch.cuda.memory's history and snapshot calls, in order, on a fresh phase profiler; a snapshot file holds
    the calls made before it."""
    for name, value in (("_calls", profiling.Counter()), ("_plan", None), ("_step", None), ("_recorders", {})):
        monkeypatch.setattr(profiling, name, value)
    monkeypatch.delenv(profiling.DIR_ENV, raising=False)
    calls: list = []

    def record_memory_history(enabled="all", **kwargs):
        calls.append(("history", enabled, kwargs))

    def dump_snapshot(filename):
        calls.append(("dump", os.path.basename(filename)))
        with open(filename, "wb") as f:
            pickle.dump(list(calls), f)

    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump_snapshot)
    return calls


def test_each_recorded_phase_call_runs_with_the_history_on_and_leaves_its_snapshot(tmp_path, recorded_memory_calls):
    cfg = config_from(*MEMORY_KEYS, f"global_profiler.save_path={tmp_path}")
    for step in (1, 2, 3):
        recorded_memory_calls.append(f"step {step}")
        profiling.start_step(cfg, step)
        for phase in ("actor_infer", "actor"):
            with PhaseTimer(CPU, phase).measure():
                recorded_memory_calls.append(phase)
    on = ("history", "all", {"context": "alloc", "stacks": "python", "max_entries": 5000, "device": CPU,
                             "clear_history": True})
    off = ("history", None, {"device": CPU})
    assert recorded_memory_calls == [
        "step 1", "actor_infer", "actor",
        "step 2", on, "actor_infer", ("dump", "actor_infer_step2_rank0.pickle"), off,
        on, "actor", ("dump", "actor_step2_rank0.pickle"), off,
        "step 3", "actor_infer", "actor"]
    assert sorted(os.listdir(tmp_path)) == ["actor_infer_step2_rank0.pickle", "actor_step2_rank0.pickle"]


def test_a_phase_that_fails_still_writes_its_snapshot(tmp_path, recorded_memory_calls):
    profiling.start_step(config_from(*MEMORY_KEYS, f"global_profiler.save_path={tmp_path}"), 2)
    with pytest.raises(torch.OutOfMemoryError), PhaseTimer(CPU, "actor").measure():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert [c[0] for c in recorded_memory_calls if isinstance(c, tuple)] == ["history", "dump", "history"]
    with open(tmp_path / "actor_step2_rank0.pickle", "rb") as f:
        assert pickle.load(f)[-1] == ("dump", "actor_step2_rank0.pickle")
