"""veRL's Nsight Systems keys (global_profiler.tool=nsys) on verlx: the config they compose into, the runtime_env the
trainer's worker actors are created with, the refusals before Ray, and the NVTX and capture-range calls a worker makes
(CPU: torch.cuda's NVTX and profiler calls are recorded, not run)."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import ray
import torch
from test_profile_plan import config_from

from verlx.config.loader import ConfigError
from verlx.single_controller.ray import RayClassWithInitArgs, RayWorkerGroup
from verlx.single_controller.ray.resource_pool import BundleSlot
from verlx.trainer.ppo_trainer import trainer_worker_class
from verlx.trainer.preflight import validate
from verlx.workers import profiling
from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker, WorkerRole
from verlx.workers.perf import PhaseTimer
from verlx.workers.profile_plan import profile_plan, profiler_notes, worker_nsight_options

CPU = torch.device("cpu")
# veRL's example command line for Nsight Systems, with a worker option changed and one added
NSYS_KEYS = ["global_profiler.tool=nsys", "global_profiler.steps=[1,2]", "actor_rollout_ref.actor.profiler.enable=True",
             "global_profiler.global_tool_config.nsys.discrete=True",
             "global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-memory-usage=false",
             "+global_profiler.global_tool_config.nsys.worker_nsight_options.gpu-metrics-devices=all"]
WORKER_OPTIONS = {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "false", "cuda-graph-trace": "graph",
                  "capture-range": "cudaProfilerApi", "capture-range-end": "repeat", "kill": "none",
                  "gpu-metrics-devices": "all"}


def test_verls_nsys_keys_compose_into_a_plan_of_nsys_phases():
    cfg = config_from(*NSYS_KEYS)
    nsys = cfg.global_profiler.global_tool_config.nsys
    assert nsys.discrete is True and nsys.controller_nsight_options == {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}
    assert nsys.worker_nsight_options["capture-range-end"] is None  # veRL's default, filled in for Ray below
    assert cfg.actor_rollout_ref.actor.profiler.tool_config.nsys.discrete is True  # follows the global key
    plan = profile_plan(cfg)
    assert sorted(plan.phases) == ["actor", "actor_infer"] and plan.steps == {1, 2}
    assert {(r.tool, r.discrete, r.ranks) for r in plan.phases.values()} == {("nsys", True, frozenset({0}))}
    assert worker_nsight_options(cfg) == WORKER_OPTIONS
    chosen = config_from(*NSYS_KEYS,
                         "global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range-end="
                         "repeat-shutdown:4")
    assert worker_nsight_options(chosen)["capture-range-end"] == "repeat-shutdown:4"
    assert worker_nsight_options(config_from(*NSYS_KEYS, "global_profiler.tool=torch")) is None
    notes = profiler_notes(cfg)
    assert "profiler keys → Nsight Systems: actor_infer (ranks [0]), actor (ranks [0]) at steps [1, 2]" in notes[0]
    assert "`nsys profile --trace=cuda,nvtx,cublas,ucx --cuda-memory-usage=false" in notes[0]
    assert "one capture range per call of actor, actor_infer (discrete=true)" in notes[0]
    assert "logs/nsight/ of its session directory" in notes[0]
    assert "controller_nsight_options is not used" in notes[1]


class _RecordedActorClass:
    """Stands in for ray.remote(cls): keeps the options each actor is created with."""

    def __init__(self):
        self.options_given: list[dict] = []

    def options(self, **options):
        self.options_given.append(options)
        return self

    def remote(self, *args, **kwargs):
        return SimpleNamespace(pick_master_address=SimpleNamespace(remote=lambda: None))


def _runtime_envs_of_trainer_actors(cfg, monkeypatch) -> list[dict]:
    """The runtime_env RayWorkerGroup creates each of two trainer actors with (Ray and its placement left out)."""
    roles = {"actor_rollout_ref": RayClassWithInitArgs(ActorRolloutRefWorker, config=cfg, role=WorkerRole(actor=True))}
    actors = _RecordedActorClass()
    monkeypatch.setattr(ray, "remote", lambda cls: actors)
    group = object.__new__(RayWorkerGroup)
    group.wait = lambda *args: [("10.0.0.1", 29500)]
    pool = SimpleNamespace(process_on_nodes=[2], slots=lambda: [BundleSlot(None, b, 0) for b in range(2)],
                           actor_resources=lambda: {"num_cpus": 1.0, "num_gpus": 1.0})
    group._create_workers(pool, trainer_worker_class(cfg, roles))
    return [options["runtime_env"] for options in actors.options_given]


def test_the_trainer_actors_run_under_nsys_with_the_worker_options(monkeypatch):
    rank0, rank1 = _runtime_envs_of_trainer_actors(config_from(*NSYS_KEYS), monkeypatch)
    assert rank0 == {"nsight": WORKER_OPTIONS,
                     "env_vars": {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}}
    assert rank1["nsight"] == WORKER_OPTIONS and rank1["env_vars"]["MASTER_PORT"] == "29500"
    torch_run = _runtime_envs_of_trainer_actors(config_from(*NSYS_KEYS, "global_profiler.tool=torch"), monkeypatch)
    assert [sorted(env) for env in torch_run] == [["env_vars"], ["env_vars"]]  # ray.init's runtime_env for the rest


def _fake_nsys(directory) -> None:
    path = os.path.join(directory, "nsys")
    with open(path, "w") as f:
        f.write("#!/bin/sh\nexit 0\n")
    os.chmod(path, 0o755)


def test_nsys_is_refused_before_ray_without_the_nsys_command_or_a_gpu(tmp_path, monkeypatch):
    _fake_nsys(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    validate(config_from(*NSYS_KEYS, "trainer.device=cuda"), check_files=False)  # nsys on PATH, a CUDA run
    monkeypatch.setenv("PATH", str(tmp_path / "elsewhere"))
    with pytest.raises(ConfigError, match=r"global_profiler.tool=nsys: the nsys command \(Nsight Systems\) is not "
                                          r"on PATH; install Nsight Systems .*or set global_profiler.tool=torch"):
        validate(config_from(*NSYS_KEYS), check_files=False)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ConfigError, match=r"global_profiler.tool=nsys with trainer.device=cpu: Nsight Systems "
                                          r"records CUDA workers; .*or set global_profiler.tool=torch"):
        validate(config_from(*NSYS_KEYS, "trainer.device=cpu"), check_files=False)
    role_only = ["global_profiler.tool=torch", "global_profiler.steps=[1]", "critic.profiler.enable=true",
                 "critic.profiler.tool=nsys", "trainer.device=cpu"]
    with pytest.raises(ConfigError, match=r"critic.profiler.tool=nsys with trainer.device=cpu"):
        validate(config_from(*role_only), check_files=False)


@pytest.fixture
def recorded_cuda_calls(monkeypatch):
    """torch.cuda's NVTX ranges and capture-range calls, in order, on a fresh phase profiler; torch.profiler must not
    run."""
    for name, value in (("_calls", profiling.Counter()), ("_plan", None), ("_step", None), ("_recorders", {})):
        monkeypatch.setattr(profiling, name, value)
    monkeypatch.delenv(profiling.DIR_ENV, raising=False)
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: calls.append(f"push {name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: calls.append("pop"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: calls.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: calls.append("stop"))
    monkeypatch.setattr(torch.profiler, "profile", None)  # a torch.profiler trace would fail here
    return calls


def _run_steps(cfg, calls: list[str]) -> None:
    """Three steps of a worker process as the driver runs them (the step's number, the actor's two phases), then
    the worker closes; each marked in `calls`."""
    for step in (1, 2, 3):
        calls.append(f"step {step}")
        profiling.start_step(cfg, step)
        for phase in ("actor_infer", "actor"):
            with PhaseTimer(CPU, phase).measure():
                pass
    calls.append("close")
    profiling.finish_profiling()


def _phases(step: int) -> list[str]:
    return [f"push actor_infer_step{step}", "pop", f"push actor_step{step}", "pop"]


def test_discrete_nsys_gives_each_phase_call_its_own_capture_range(recorded_cuda_calls):
    _run_steps(config_from(*NSYS_KEYS, "global_profiler.steps=[1,3]"), recorded_cuda_calls)
    per_call = ["start", "push actor_infer_step{}", "pop", "stop", "start", "push actor_step{}", "pop", "stop"]
    assert recorded_cuda_calls == ["step 1", *[c.format(1) for c in per_call], "step 2",
                                   "step 3", *[c.format(3) for c in per_call], "close"]


def test_nsys_per_step_capture_range_ends_when_the_next_step_starts_or_the_worker_closes(recorded_cuda_calls):
    _run_steps(config_from(*NSYS_KEYS, "global_profiler.steps=[1,3]",
                           "global_profiler.global_tool_config.nsys.discrete=False"), recorded_cuda_calls)
    assert recorded_cuda_calls == ["step 1", "start", *_phases(1), "step 2", "stop",
                                   "step 3", "start", *_phases(3), "close", "stop"]


def test_continuous_steps_share_one_nsys_capture_range(recorded_cuda_calls):
    _run_steps(config_from(*NSYS_KEYS, "global_profiler.global_tool_config.nsys.discrete=False",
                           "global_profiler.profile_continuous_steps=True", "global_profiler.steps=[1,2]"),
               recorded_cuda_calls)
    assert recorded_cuda_calls == ["step 1", "start", *_phases(1), "step 2", *_phases(2), "step 3", "stop", "close"]
