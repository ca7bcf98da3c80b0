"""multi_turn config: the keys compose from the YAML, and every bad value is reported before Ray starts,
naming the key (and, for the tool file, the file and entry)."""

from __future__ import annotations

import re

import pytest

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.rollout.agent.config_checks import agent_loop_problems
from verlx.trainer.preflight import validate

ON = ["actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true",
      "actor_rollout_ref.rollout.name=native"]


def config(*overrides):
    return build(PPOConfig, to_container(load_yaml(overrides=list(overrides))))


def test_defaults_follow_verl_layout():
    mt = config().actor_rollout_ref.rollout.multi_turn
    assert (mt.enable, mt.max_assistant_turns, mt.max_parallel_calls, mt.max_tool_response_length, mt.format,
            mt.tool_config_path) == (False, 5, 1, 256, "hermes", None)
    assert agent_loop_problems(config()) == []
    assert agent_loop_problems(config(*ON)) == []


@pytest.mark.parametrize("override, message", [
    ("data.return_raw_chat=false", "needs data.return_raw_chat=true"),
    ("actor_rollout_ref.rollout.multi_turn.format=hermez", "unknown tool-call format 'hermez'.*Did you mean 'hermes'"),
    ("actor_rollout_ref.rollout.multi_turn.format=gpt-oss",
     r"format=gpt-oss: verlx does not support the gpt-oss \(harmony\) tool-call format yet"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop=tool_agnt", "unknown agent loop 'tool_agnt'"),
    ("actor_rollout_ref.rollout.agent.default_agent_loop=no.such:Loop", "default_agent_loop: .*cannot import Loop"),
    ("actor_rollout_ref.rollout.multi_turn.max_assistant_turns=0", "max_assistant_turns=0 must be >= 1"),
    ("actor_rollout_ref.rollout.multi_turn.max_parallel_calls=0", "max_parallel_calls=0 must be >= 1"),
    ("actor_rollout_ref.rollout.multi_turn.tool_timeout_s=0", "tool_timeout_s=0.0 must be > 0"),
    ("actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=up", "truncate_side='up' is not one of"),
    ("actor_rollout_ref.rollout.multi_turn.on_template_mismatch=ignore", "on_template_mismatch='ignore' is not"),
    ("actor_rollout_ref.rollout.multi_turn.tool_config_path=/nonexistent/tools.yaml",
     "tool_config_path: .*'/nonexistent/tools.yaml' does not exist"),
])
def test_bad_values_are_named(override, message):
    problems = agent_loop_problems(config(*ON, override))
    assert len(problems) == 1, problems
    assert re.search(message, problems[0]), problems[0]


def test_verls_agent_loop_config_file_names_loops(tmp_path):
    from verlx.rollout.agent.loop_config import agent_loop_class
    from verlx.rollout.agent.loops import ToolAgentLoop

    path = tmp_path / "agent.yaml"
    path.write_text("- name: calc\n  _target_: verlx.rollout.agent.loops.ToolAgentLoop\n"
                    "- name: mine\n  _target_: helpers.async_loops:ThreeTokenLoop\n")
    key = f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}"
    assert agent_loop_problems(config(*ON, key, "actor_rollout_ref.rollout.agent.default_agent_loop=calc")) == []
    assert agent_loop_class("calc", str(path)) is ToolAgentLoop
    assert agent_loop_class("single_turn_agent", str(path)).__name__ == "SingleTurnAgentLoop"  # the registry's
    calls_tools = agent_loop_problems(config(key, "actor_rollout_ref.rollout.mode=async",
                                             "actor_rollout_ref.rollout.agent.default_agent_loop=calc"))
    assert len(calls_tools) == 1 and "default_agent_loop=calc calls tools" in calls_tools[0]


@pytest.mark.parametrize("text, message", [
    ("- name: collabllm_agent\n  _target_: recipe.collabllm.collabllm_agent_loop.CollabLLMAgentLoop\n",
     r"collabllm_agent: .*verlx does not support veRL's own classes \(recipe.collabllm.collabllm_agent_loop\)"),
    ("- name: x\n", r"entry 0 is \{'name': 'x'\}; expected \{name: ..., _target_"),
    ("- name: x\n  _target_: helpers.async_loops.operands\n", r"x: agent loop 'x' .* is not an AgentLoop subclass"),
])
def test_a_bad_agent_loop_config_file_names_the_file_and_entry(tmp_path, text, message):
    path = tmp_path / "agent.yaml"
    path.write_text(text)
    problems = agent_loop_problems(config(*ON, f"actor_rollout_ref.rollout.agent.agent_loop_config_path={path}"))
    assert len(problems) == 1 and re.search(message, problems[0]), problems
    assert "agent_loop_config_path" in problems[0]


def test_vllm_tensor_parallel_is_refused():
    """vLLM declares its tensor-parallel peers run in lockstep: tool calls finishing at different times break it."""
    from verlx.rollout.capabilities import capability_problems

    problems = capability_problems(config(*ON, "actor_rollout_ref.rollout.name=vllm",
                                          "actor_rollout_ref.rollout.tensor_model_parallel_size=2"))
    assert len(problems) == 1 and "multi_turn.enable=true with actor_rollout_ref.rollout.name=vllm needs " \
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1 (got 2)" in problems[0]
    assert capability_problems(config(*ON, "actor_rollout_ref.rollout.name=sglang",
                                      "actor_rollout_ref.rollout.tensor_model_parallel_size=2")) == []


def test_tool_file_problem_names_file_and_entry_through_validate(tmp_path):
    path = tmp_path / "tools.yaml"
    path.write_text("tools:\n  - name: calculator\n  - function: tests.unit.test_agent_config:undocumented\n")
    with pytest.raises(ConfigError) as e:
        validate(config(*ON, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={path}"), check_files=False)
    assert f"{path}: tools[1]" in str(e.value) and "docstring" in str(e.value)


def undocumented(x: int) -> int:
    return x


def test_agent_names_and_prompt_room_are_checked_on_the_loaded_data(tmp_path):
    from verlx.config.run import DataConfig
    from verlx.data import RLHFDataset, write_parquet_atomic
    from verlx.models.tiny import build_tokenizer
    from verlx.rollout.agent.config_checks import agent_data_problems

    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": f"{k}*3=?"}],
             "agent_name": name, "reward_model": {"ground_truth": str(3 * k)}}
            for k, name in enumerate(["tool_agent", "single_turn_agent", "tool_agnet"])]
    path = write_parquet_atomic(rows, str(tmp_path / "train.parquet"))
    tools = tmp_path / "tools.yaml"
    tools.write_text("tools:\n  - name: calculator\n")
    tokenizer = build_tokenizer()

    def problems(max_prompt_length, keep=3):
        cfg = config(*ON, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}",
                     f"data.max_prompt_length={max_prompt_length}")
        dataset = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=max_prompt_length, return_raw_chat=True),
                              max_samples=keep)
        return agent_data_problems(cfg, tokenizer, dataset, "data.train_files")

    found = problems(64)
    assert len(found) == 1 and "data.train_files: column agent_name: unknown agent loop 'tool_agnet'" in found[0]
    assert "Did you mean 'tool_agent'" in found[0]
    assert problems(64, keep=2) == []  # the tiny model's template does not render tools: the prompt fits
    tok_with_tools = build_tokenizer()
    tok_with_tools.chat_template = "{{ tools | tojson }}" + tok_with_tools.chat_template
    cfg = config(*ON, f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tools}", "data.max_prompt_length=64")
    dataset = RLHFDataset(path, tok_with_tools, DataConfig(max_prompt_length=512, return_raw_chat=True),
                          max_samples=2)
    found = agent_data_problems(cfg, tok_with_tools, dataset, "data.train_files")
    assert len(found) == 1 and "rendered with the tools' schemas has" in found[0]
    assert "data.max_prompt_length=64" in found[0]


# ---------------------------------------------------------------------- rollout.mode=async (veRL's agent-loop rollout)
ASYNC = ["actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.name=native"]


def test_verl_agent_loop_keys_compose():
    """The keys veRL's agent-loop launch scripts set (examples/sglang_multiturn, 2026-01) compose and pass."""
    cfg = config("actor_rollout_ref.rollout.mode=async", "actor_rollout_ref.rollout.name=sglang",
                 "actor_rollout_ref.rollout.over_sample_rate=0.1", "actor_rollout_ref.rollout.agent.num_workers=8",
                 "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
                 "actor_rollout_ref.rollout.multi_turn.enable=true", "data.return_raw_chat=true")
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.mode, rollout.over_sample_rate, rollout.agent.num_workers, rollout.agent.default_agent_loop) == \
        ("async", 0.1, 8, "tool_agent")
    assert rollout.uses_agent_loop and agent_loop_problems(cfg) == []
    default = config().actor_rollout_ref.rollout
    assert (default.mode, default.over_sample_rate, default.agent.default_agent_loop) == ("sync", 0.0,
                                                                                         "single_turn_agent")
    assert not default.uses_agent_loop and agent_loop_problems(config(*ASYNC)) == []


@pytest.mark.parametrize("overrides, message", [
    (["actor_rollout_ref.rollout.mode=one_step_off"],
     r"rollout.mode='one_step_off' is not one of \['sync', 'async'\].*trainer.rollout_mode=one_step_off\|async"),
    (["actor_rollout_ref.rollout.over_sample_rate=0.1"],
     r"over_sample_rate=0.1 cancels the slowest samples of the agent-loop rollout, which is off: set "
     r"actor_rollout_ref.rollout.mode=async"),
    ([*ASYNC, "actor_rollout_ref.rollout.over_sample_rate=1.0"], r"over_sample_rate=1.0 must be in \[0, 1\)"),
    ([*ASYNC, "actor_rollout_ref.rollout.agent.num_workers=0"], r"agent.num_workers=0 must be >= 1"),
    ([*ASYNC, "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent"],
     r"default_agent_loop=tool_agent calls tools, which needs actor_rollout_ref.rollout.multi_turn.enable=true"),
    ([*ASYNC, "actor_rollout_ref.rollout.agent.default_agent_loop=single_turn"],
     r"unknown agent loop 'single_turn'.*Did you mean 'single_turn_agent'"),
])
def test_agent_loop_rollout_refusals_name_the_key(overrides, message):
    problems = agent_loop_problems(config(*overrides))
    assert len(problems) == 1, problems
    assert re.search(message, problems[0]), problems[0]


def test_partial_rollout_is_refused_with_mode_async_and_async_training_is_not():
    off_policy = ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
                  "trainer.rollout_mode=async", "trainer.max_staleness=1", "trainer.device=cpu", *ASYNC]
    with pytest.raises(ConfigError) as e:
        validate(config(*off_policy, "trainer.partial_rollout=true"), world_size=1, check_files=False)
    assert "trainer.partial_rollout=true with actor_rollout_ref.rollout.mode=async (the agent-loop rollout)" in \
        str(e.value)
    validate(config(*off_policy), world_size=1, check_files=False)  # the two "async" keys compose


def test_main_generation_refuses_over_sampling(tmp_path):
    from verlx.config.generation import GenerationConfig
    from verlx.trainer.main_generation import validate as validate_generation

    cfg = build(GenerationConfig, to_container(load_yaml("generation", schema=GenerationConfig, overrides=[
        "rollout.over_sample_rate=0.2", f"data.path={tmp_path}/missing.parquet", f"model.path={tmp_path}"])))
    with pytest.raises(ConfigError) as e:
        validate_generation(cfg)
    assert "rollout.over_sample_rate=0.2: main_generation writes a response for every prompt" in str(e.value)


def test_a_tool_loop_named_in_the_data_needs_multi_turn(tmp_path):
    from verlx.config.run import DataConfig
    from verlx.data import RLHFDataset, write_parquet_atomic
    from verlx.models.tiny import build_tokenizer
    from verlx.rollout.agent.config_checks import agent_data_problems

    rows = [{"data_source": "arithmetic", "prompt": [{"role": "user", "content": "1*3=?"}], "agent_name": name,
             "reward_model": {"ground_truth": "3"}} for name in ("single_turn_agent", "tool_agent")]
    path = write_parquet_atomic(rows, str(tmp_path / "train.parquet"))
    tokenizer = build_tokenizer()
    dataset = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=64, return_raw_chat=True))
    found = agent_data_problems(config(*ASYNC), tokenizer, dataset, "data.train_files")
    assert found == ["data.train_files: column agent_name: tool_agent calls tools, which needs "
                     "actor_rollout_ref.rollout.multi_turn.enable=true"]
    assert agent_data_problems(config(), tokenizer, dataset, "data.train_files") == []  # mode=sync: not read


def test_an_unknown_trainer_rollout_mode_points_at_the_other_key():
    from verlx.trainer.rollout_modes.config_checks import rollout_mode_problems

    problems = rollout_mode_problems(config("trainer.rollout_mode=agent"))
    assert problems == ["trainer.rollout_mode='agent' is not one of ['sync', 'one_step_off', 'async'] (off-policy "
                        "training, docs/async.md; veRL's agent-loop rollout is actor_rollout_ref.rollout.mode=async)"]
