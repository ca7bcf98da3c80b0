"""Checks of actor_rollout_ref.rollout.multi_turn, run with the config validation before Ray starts: the
engine can take requests as they come, the names resolve, the tool file loads and its schemas validate."""

from __future__ import annotations

KEY = "actor_rollout_ref.rollout.multi_turn"
TRUNCATE_SIDES = ("left", "right", "middle")
MISMATCH_ACTIONS = ("mask", "error")


def multi_turn_problems(cfg) -> list[str]:
    """Every problem of the multi_turn section of a PPOConfig; empty when it is off or fine."""
    rollout = cfg.actor_rollout_ref.rollout
    mt = rollout.multi_turn
    if not mt.enable:
        return []
    from verlx.rollout.agent.backends import AGENT_BACKENDS

    problems = []
    if rollout.name != "auto" and rollout.name not in AGENT_BACKENDS:
        problems.append(f"{KEY}.enable=true needs an engine that takes requests as they come, but "
                        f"actor_rollout_ref.rollout.name={rollout.name} cannot; use native (needs nothing beyond "
                        f"torch), sglang or vllm")
    if rollout.name == "vllm" and rollout.tensor_model_parallel_size > 1:
        problems.append(f"{KEY}.enable=true with rollout.name=vllm needs rollout.tensor_model_parallel_size=1 "
                        f"(got {rollout.tensor_model_parallel_size}): vLLM's tensor-parallel peers must receive the "
                        "same requests in the same order, which tool calls finishing at different times break; use "
                        "sglang or native for tensor-parallel multi-turn")
    if not cfg.data.return_raw_chat:
        problems.append(f"{KEY}.enable=true needs data.return_raw_chat=true: the agent loop renders the "
                        "conversation (prompt messages, tools, tool results) with the chat template itself")
    problems += _number_problems(mt)
    problems += _name_problems(mt)
    return problems


def _number_problems(mt) -> list[str]:
    problems = []
    if mt.max_assistant_turns is not None and mt.max_assistant_turns < 1:
        problems.append(f"{KEY}.max_assistant_turns={mt.max_assistant_turns} must be >= 1 or null")
    if mt.max_user_turns is not None and mt.max_user_turns < 0:
        problems.append(f"{KEY}.max_user_turns={mt.max_user_turns} must be >= 0 or null")
    if mt.max_parallel_calls < 1:
        problems.append(f"{KEY}.max_parallel_calls={mt.max_parallel_calls} must be >= 1")
    if mt.max_tool_response_length < 32:
        problems.append(f"{KEY}.max_tool_response_length={mt.max_tool_response_length} must be >= 32 characters")
    if not mt.tool_timeout_s > 0:
        problems.append(f"{KEY}.tool_timeout_s={mt.tool_timeout_s} must be > 0")
    if mt.tool_response_truncate_side not in TRUNCATE_SIDES:
        problems.append(f"{KEY}.tool_response_truncate_side={mt.tool_response_truncate_side!r} is not one of "
                        f"{list(TRUNCATE_SIDES)}")
    if mt.on_template_mismatch not in MISMATCH_ACTIONS:
        problems.append(f"{KEY}.on_template_mismatch={mt.on_template_mismatch!r} is not one of "
                        f"{list(MISMATCH_ACTIONS)}")
    return problems


def _name_problems(mt) -> list[str]:
    from verlx.rollout.agent.loops import AGENT_LOOPS
    from verlx.rollout.agent.parsers import TOOL_PARSERS
    from verlx.rollout.agent.tool_config import load_tools

    problems = []
    for key, value, registry in (("format", mt.format, TOOL_PARSERS), ("default_agent", mt.default_agent,
                                                                       AGENT_LOOPS)):
        try:
            registry.get(value)
        except (KeyError, ValueError) as e:
            problems.append(f"{KEY}.{key}: {e}")
    if mt.tool_config_path:
        try:
            load_tools(mt.tool_config_path)
        except ValueError as e:
            problems.append(f"{KEY}.tool_config_path: {e}")
    return problems
