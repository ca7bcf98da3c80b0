"""veRL's profiler keys on verlx's phase profiler: which phases, steps and ranks they select, what is refused, and
the traces a selected step writes (CPU: a PolicyModel actor on an FSDPEngine, as in test_profiling.py)."""

from __future__ import annotations

import json

import pytest
import torch
from test_profiling import _actor
from torch.profiler import ProfilerActivity

from helpers.ppo_batches import ragged_ppo_batch
from verlx.config.loader import ConfigError, Findings, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer.preflight import validate
from verlx.workers import profiling
from verlx.workers.perf import PhaseTimer
from verlx.workers.profile_plan import check_profiler, profile_plan, profiler_notes

CPU = torch.device("cpu")
# the keys veRL's examples/ppo_trainer/run_qwen2-7b_rm_seq_balance_nsys.sh sets, with tool=torch
VERL_KEYS = ["global_profiler.tool=torch", "global_profiler.steps=[1,2,5]",
             "actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.actor.profiler.ranks=[0,4]",
             "actor_rollout_ref.actor.profiler.all_ranks=False", "critic.profiler.enable=True",
             "critic.profiler.all_ranks=True", "actor_rollout_ref.ref.profiler.enable=True"]


def config_from(*overrides) -> PPOConfig:
    return build(PPOConfig, to_container(load_yaml(overrides=list(overrides))))


def test_verls_keys_select_phases_steps_and_ranks(tmp_path):
    cfg = config_from(*VERL_KEYS, f"global_profiler.save_path={tmp_path}")
    plan = profile_plan(cfg)
    assert plan.steps == {1, 2, 5}
    assert sorted(plan.phases) == ["actor", "actor_infer", "critic", "critic_infer", "ref"]
    assert plan.phases["actor"].ranks == {0, 4} and plan.phases["critic"].ranks is None  # all_ranks
    assert plan.phases["ref"].ranks == {0}  # enabled without ranks: rank 0, as veRL does
    assert plan.phases["actor"].directory == str(tmp_path)
    assert plan.request("actor", 2, 4) is plan.phases["actor"]
    assert plan.request("actor", 3, 4) is None and plan.request("actor", 2, 1) is None
    assert plan.request("gen", 1, 0) is None  # the rollout's profiler is off
    assert profile_plan(config_from("global_profiler.tool=torch", "critic.profiler.enable=true")) is None  # no steps
    assert profile_plan(config_from("global_profiler.steps=[1]", "critic.profiler.enable=true")) is None  # no tool
    notes = profiler_notes(cfg)
    assert "actor_infer (ranks [0, 4])" in notes[0] and "at steps [1, 2, 5]" in notes[0]
    assert "verlx writes one trace per phase and step" in notes[1]  # veRL's default discrete=false


def test_unsupported_profiler_settings_are_refused_before_ray():
    cfg = config_from("global_profiler.tool=precision_debugger", "global_profiler.steps=[1]",
                      "actor_rollout_ref.actor.profiler.enable=True", "critic.profiler.enable=true",
                      "critic.profiler.tool=npu", "critic.profiler.ranks=[0,9]",
                      "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[cuda,flops]",
                      "trainer.n_gpus_per_node=8")
    with pytest.raises(ConfigError) as e:
        validate(cfg, check_files=False)
    text = str(e.value)
    assert "global_profiler.tool=precision_debugger: verlx profiles with torch, nsys, torch_memory" in text
    assert "critic.profiler.tool=npu: verlx profiles with torch, nsys, torch_memory" in text
    assert "Set critic.profiler.tool to one of torch, nsys, torch_memory" in text
    assert "critic.profiler.ranks=[0, 9]: ranks [9] do not exist among the 8 workers" in text
    assert "contents: ['flops'] are not among" in text
    rollout = config_from("global_profiler.tool=torch", "global_profiler.steps=[1]",
                          "actor_rollout_ref.rollout.profiler.enable=true", "actor_rollout_ref.hybrid_engine=false")
    findings = Findings()
    check_profiler(rollout, findings, world_size=8)
    assert len(findings.problems) == 1 and "profiles the rollout engines colocated with the actor only" in \
        findings.problems[0]


def test_profiling_that_would_trace_nothing_warns():
    warnings = validate(config_from("global_profiler.tool=torch", "critic.profiler.enable=true",
                                    "trainer.n_gpus_per_node=8"), check_files=False)
    assert any("global_profiler.steps is null: nothing is profiled" in w for w in warnings)


@pytest.fixture
def fresh_profiler(monkeypatch):
    for name, value in (("_calls", profiling.Counter()), ("_plan", None), ("_step", None), ("_recorders", {})):
        monkeypatch.setattr(profiling, name, value)
    monkeypatch.delenv(profiling.DIR_ENV, raising=False)


def test_the_selected_steps_are_traced(tmp_path, fresh_profiler):
    cfg = config_from("global_profiler.tool=torch", "global_profiler.steps=[2]",
                      f"global_profiler.save_path={tmp_path}",
                      "actor_rollout_ref.actor.profiler.enable=true",
                      "actor_rollout_ref.actor.profiler.tool_config.torch.contents=[shapes]")
    actor = _actor()
    for step in (1, 2, 3):
        profiling.start_step(cfg, step)
        data = ragged_ppo_batch(step, rows=8, token_range=(1, 61), meta_info={"temperature": 1.0})
        with PhaseTimer(CPU, "actor").measure():
            actor.update_policy(data, 4, None)
        for _ in range(2):  # a phase run twice in one step: the second trace gets a suffix
            with PhaseTimer(CPU, "actor_infer").measure():
                actor.compute_log_prob(data, None, True, 40)
        with PhaseTimer(CPU, "ref").measure():  # the reference's profiler is off
            actor.compute_log_prob(data, None, True, 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{stem}{suffix}" for stem in ("actor_step2_rank0", "actor_infer_step2_rank0", "actor_infer_step2_rank0_2")
        for suffix in (".json", "_summary.json"))
    summary = json.loads((tmp_path / "actor_step2_rank0_summary.json").read_text())
    assert (summary["phase"], summary["step"], summary["rank"], summary["optimizer_steps"]) == ("actor", 2, 0, 2)
    trace = json.loads((tmp_path / "actor_step2_rank0.json").read_text())
    assert any("Input Dims" in e.get("args", {}) for e in trace["traceEvents"])  # contents=[shapes]


def test_contents_become_torch_profiler_arguments():
    gpu = torch.device("cuda")  # a device object only: nothing runs on it
    assert profiling.profiler_arguments(gpu, frozenset()) == {
        "activities": [ProfilerActivity.CPU, ProfilerActivity.CUDA], "profile_memory": False, "record_shapes": False,
        "with_stack": False}
    assert profiling.profiler_arguments(gpu, frozenset({"memory", "stack"})) == {
        "activities": [ProfilerActivity.CPU], "profile_memory": True, "record_shapes": False, "with_stack": True}
    assert profiling.profiler_arguments(CPU, frozenset({"cuda", "shapes"}))["activities"] == [ProfilerActivity.CPU]
