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
    problems, tool_rows = [], []
    for name in sorted(set(names)):
        try:
            cls = AGENT_LOOPS.get(name)
        except (KeyError, ValueError) as e:
            problems.append(f"{which}: column agent_name: {e}")
            continue
        if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
            problems.append(f"{which}: column agent_name: {name} is not an AgentLoop subclass")
        elif cls.uses_tools:
            tool_rows += [i for i, n in enumerate(names) if n == name]
    raw = dataset.column("raw_prompt")
    if problems or not tool_rows or raw is None:
        return problems
    schemas = [t.schema for t in load_tools(mt.tool_config_path).values()] if mt.tool_config_path else None
    codec = ChatCodec(tokenizer, schemas, cfg.data.apply_chat_template_kwargs, [])
    lengths = dataset.prompt_lengths
    limit = cfg.data.max_prompt_length
    for i in sorted(tool_rows, key=lambda r: -lengths[r])[:longest]:
        n = len(codec.prompt_ids([dict(m) for m in raw[i]]))
        if n > limit:
            problems.append(f"{which}: a prompt rendered with the tools' schemas has {n} tokens, more than "
                            f"data.max_prompt_length={limit} (row {i} of the loaded data); raise "
                            "data.max_prompt_length")
            break
    return problems
