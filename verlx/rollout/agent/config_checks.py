"""Checks of actor_rollout_ref.rollout.multi_turn, run with the config validation before Ray starts: the
engine can take requests as they come, the names resolve, the tool file loads and its schemas validate."""

from __future__ import annotations

from verlx.config.loader import Findings

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

    f = Findings()
    f.require(rollout.name == "auto" or rollout.name in AGENT_BACKENDS,
              f"{KEY}.enable=true needs an engine that takes requests as they come, but "
              f"actor_rollout_ref.rollout.name={rollout.name} cannot; use native (needs nothing beyond torch), "
              "sglang or vllm")
    f.require(not (rollout.name == "vllm" and rollout.tensor_model_parallel_size > 1),
              f"{KEY}.enable=true with rollout.name=vllm needs rollout.tensor_model_parallel_size=1 "
              f"(got {rollout.tensor_model_parallel_size}): vLLM's tensor-parallel peers must receive the same "
              "requests in the same order, which tool calls finishing at different times break; use sglang or "
              "native for tensor-parallel multi-turn")
    f.require(cfg.data.return_raw_chat,
              f"{KEY}.enable=true needs data.return_raw_chat=true: the agent loop renders the conversation (prompt "
              "messages, tools, tool results) with the chat template itself")
    _check_numbers(mt, f)
    _check_names(mt, f)
    return f.problems


def _check_numbers(mt, f: Findings) -> None:
    f.require(mt.max_assistant_turns is None or mt.max_assistant_turns >= 1,
              f"{KEY}.max_assistant_turns={mt.max_assistant_turns} must be >= 1 or null")
    f.require(mt.max_user_turns is None or mt.max_user_turns >= 0,
              f"{KEY}.max_user_turns={mt.max_user_turns} must be >= 0 or null")
    f.require(mt.max_parallel_calls >= 1, f"{KEY}.max_parallel_calls={mt.max_parallel_calls} must be >= 1")
    f.require(mt.max_tool_response_length >= 32,
              f"{KEY}.max_tool_response_length={mt.max_tool_response_length} must be >= 32 characters")
    f.require(mt.tool_timeout_s > 0, f"{KEY}.tool_timeout_s={mt.tool_timeout_s} must be > 0")
    f.choice(f"{KEY}.tool_response_truncate_side", mt.tool_response_truncate_side, TRUNCATE_SIDES)
    f.choice(f"{KEY}.on_template_mismatch", mt.on_template_mismatch, MISMATCH_ACTIONS)


def _check_names(mt, f: Findings) -> None:
    from verlx.rollout.agent.loops import AGENT_LOOPS
    from verlx.rollout.agent.parsers import TOOL_PARSERS
    from verlx.rollout.agent.tool_config import load_tools

    for key, value, registry in (("format", mt.format, TOOL_PARSERS), ("default_agent", mt.default_agent,
                                                                       AGENT_LOOPS)):
        try:
            registry.get(value)
        except (KeyError, ValueError) as e:
            f.problems.append(f"{KEY}.{key}: {e}")
    if mt.tool_config_path:
        try:
            load_tools(mt.tool_config_path)
        except ValueError as e:
            f.problems.append(f"{KEY}.tool_config_path: {e}")


def agent_data_problems(cfg, tokenizer, dataset, which: str, longest: int = 8) -> list[str]:
    """Problems of a loaded RLHFDataset for multi-turn rollouts, found before Ray starts: agent_name values that
    are no agent loop, and prompts that do not fit data.max_prompt_length once rendered with the tools' schemas
    (checked on the `longest` longest prompts). `which`: data.train_files or data.val_files."""
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    if not mt.enable or dataset is None:
        return []
    from verlx.rollout.agent.chat import ChatCodec
    from verlx.rollout.agent.loops import AGENT_LOOPS, AgentLoop
    from verlx.rollout.agent.tool_config import load_tools

    names = dataset.column("agent_name")
    names = [mt.default_agent] * len(dataset) if names is None else [str(n) if n else mt.default_agent for n in names]
    f, tool_rows = Findings(), []
    for name in sorted(set(names)):
        try:
            cls = AGENT_LOOPS.get(name)
        except (KeyError, ValueError) as e:
            f.problems.append(f"{which}: column agent_name: {e}")
            continue
        if f.require(isinstance(cls, type) and issubclass(cls, AgentLoop),
                     f"{which}: column agent_name: {name} is not an AgentLoop subclass") and cls.uses_tools:
            tool_rows += [i for i, n in enumerate(names) if n == name]
    raw = dataset.column("raw_prompt")
    if f.problems or not tool_rows or raw is None:
        return f.problems
    schemas = [t.schema for t in load_tools(mt.tool_config_path).values()] if mt.tool_config_path else None
    codec = ChatCodec(tokenizer, schemas, cfg.data.apply_chat_template_kwargs, [])
    lengths = dataset.prompt_lengths
    limit = cfg.data.max_prompt_length
    for i in sorted(tool_rows, key=lambda r: -lengths[r])[:longest]:
        n = len(codec.prompt_ids([dict(m) for m in raw[i]]))
        if not f.require(n <= limit, f"{which}: a prompt rendered with the tools' schemas has {n} tokens, more than "
                         f"data.max_prompt_length={limit} (row {i} of the loaded data); raise data.max_prompt_length"):
            break
    return f.problems
