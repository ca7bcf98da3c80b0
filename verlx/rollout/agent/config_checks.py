"""Checks of the agent-loop rollout's keys (actor_rollout_ref.rollout.mode, over_sample_rate, agent.*,
multi_turn.*), run with the config validation before Ray starts: the names resolve, the tool and interaction files
load and the tools' schemas validate (what the engine must be able to do is checked with the other capabilities,
rollout/capabilities.py)."""

from __future__ import annotations

from verlx.config.loader import Findings

ROLLOUT = "actor_rollout_ref.rollout"
KEY = f"{ROLLOUT}.multi_turn"
ROLLOUT_MODES = ("sync", "async")
TRUNCATE_SIDES = ("left", "right", "middle")
MISMATCH_ACTIONS = ("mask", "error")


def agent_loop_problems(cfg) -> list[str]:
    """Every problem of rollout.mode / over_sample_rate / agent / multi_turn of a PPOConfig; empty when fine."""
    return agent_loop_findings(cfg).problems


def agent_loop_findings(cfg) -> Findings:
    """The problems and warnings (a tool that may outlast multi_turn.tool_timeout_s) of agent_loop_problems."""
    rollout = cfg.actor_rollout_ref.rollout
    f = Findings()
    if rollout.mode not in ROLLOUT_MODES:
        return Findings([f"{ROLLOUT}.mode={rollout.mode!r} is not one of {list(ROLLOUT_MODES)} (async: veRL's "
                         "agent-loop rollout, docs/rollout.md). Generating while the trainer trains is another key: "
                         "trainer.rollout_mode=one_step_off|async (docs/async.md)"])
    rate = rollout.over_sample_rate
    f.require(0 <= rate < 1, f"{ROLLOUT}.over_sample_rate={rate} must be in [0, 1): the fraction of a batch's "
              "slowest samples to cancel")
    f.require(not rollout.multi_turn.interaction_config_path or rollout.multi_turn.enable,
              f"{KEY}.interaction_config_path is set but {KEY}.enable=false: the interactions answer the tool_agent "
              f"loop, which needs {KEY}.enable=true (and data.return_raw_chat=true)")
    if not rollout.uses_agent_loop:
        f.require(rate == 0, f"{ROLLOUT}.over_sample_rate={rate} cancels the slowest samples of the agent-loop "
                  f"rollout, which is off: set {ROLLOUT}.mode=async (or multi_turn.enable=true), or "
                  "over_sample_rate=0")
        return f
    f.require(rollout.agent.num_workers >= 1, f"{ROLLOUT}.agent.num_workers={rollout.agent.num_workers} must be "
              ">= 1 (threads per rollout worker for synchronous tool calls)")
    _check_default_loop(rollout, f)
    if rollout.multi_turn.enable:
        f.require(cfg.data.return_raw_chat,
                  f"{KEY}.enable=true needs data.return_raw_chat=true: the agent loop renders the conversation "
                  "(prompt messages, tools, tool results) with the chat template itself")
        _check_numbers(rollout.multi_turn, f)
        _check_names(rollout.multi_turn, f)
    return f


def _check_default_loop(rollout, f: Findings) -> None:
    from verlx.rollout.agent.loop_config import agent_loop_class, named_loops

    config_path = rollout.agent.agent_loop_config_path
    for name in named_loops(config_path) if config_path and _loads(config_path, f) else ():
        try:
            agent_loop_class(name, config_path)
        except (KeyError, ValueError, TypeError) as e:
            f.problems.append(f"{ROLLOUT}.agent.agent_loop_config_path={config_path}: {name}: {e}")
    key = f"{ROLLOUT}.agent.default_agent_loop"
    try:
        cls = agent_loop_class(rollout.agent.default_agent_loop, config_path if _loads(config_path, f) else None)
    except (KeyError, ValueError, TypeError) as e:
        f.problems.append(f"{key}: {e}")
        return
    f.require(not cls.uses_tools or rollout.multi_turn.enable,
              f"{key}={rollout.agent.default_agent_loop} calls tools, which needs {KEY}.enable=true (with "
              f"{KEY}.tool_config_path and data.return_raw_chat=true)")
    if rollout.multi_turn.interaction_config_path and not cls.asks_interaction:
        f.warnings.append(f"{KEY}.interaction_config_path is set, but rows without an agent_name column run "
                          f"{key}={rollout.agent.default_agent_loop}, which never asks an interaction (veRL's "
                          f"{rollout.agent.default_agent_loop} does not either): set {key}=tool_agent to have "
                          "them answered by their interaction")


def _loads(config_path: str | None, f: Findings) -> bool:
    """rollout.agent.agent_loop_config_path is unset, or its file reads (else its problem is recorded once)."""
    from verlx.rollout.agent.loop_config import named_loops

    if not config_path:
        return False
    try:
        named_loops(config_path)
    except ValueError as e:
        if str(e) not in f.problems:
            f.problems.append(str(e))
        return False
    return True


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
    from verlx.rollout.agent.parsers import MISSING_FORMATS, TOOL_PARSERS
    from verlx.rollout.agent.tool_config import load_tools

    try:
        TOOL_PARSERS.get(mt.format)
    except (KeyError, ValueError) as e:
        missing = MISSING_FORMATS.get(mt.format)
        f.problems.append(f"{KEY}.format={mt.format}: verlx does not support {missing} yet; its formats are "
                          f"{TOOL_PARSERS.names()} or 'package.module:function' of your own" if missing
                          else f"{KEY}.format: {e}")
    if mt.interaction_config_path:
        from verlx.rollout.agent.interaction_config import load_interactions

        try:
            load_interactions(mt.interaction_config_path)
        except ValueError as e:
            f.problems.append(f"{KEY}.interaction_config_path: {e}")
    if mt.tool_config_path:
        try:
            tools = load_tools(mt.tool_config_path)
        except ValueError as e:
            f.problems.append(f"{KEY}.tool_config_path: {e}")
            return
        for tool in tools.values():
            if tool.answer_within_s is not None and tool.answer_within_s > mt.tool_timeout_s:
                f.warnings.append(f"{KEY}.tool_timeout_s={mt.tool_timeout_s:g} is shorter than the "
                                  f"{tool.answer_within_s:g} s tool {tool.name} may take by its config: a call "
                                  f"that slow is answered 'error: {tool.name} did not answer within "
                                  f"{mt.tool_timeout_s:g} s'; raise tool_timeout_s to {tool.answer_within_s:g} to "
                                  "wait as long as the tool does")


def agent_data_problems(cfg, tokenizer, dataset, which: str, longest: int = 8) -> list[str]:
    """Problems of a loaded RLHFDataset for the agent-loop rollout, found before Ray starts: agent_name values that
    are no agent loop (or call tools without multi_turn.enable), rows of loops that ask an interaction whose
    extra_info.interaction_kwargs names none of the interaction file's, and prompts that do not fit
    data.max_prompt_length once rendered with the tools' schemas (checked on the `longest` longest prompts).
    `which`: data.train_files or data.val_files."""
    rollout = cfg.actor_rollout_ref.rollout
    mt = rollout.multi_turn
    if not rollout.uses_agent_loop or dataset is None:
        return []
    from verlx.rollout.agent.chat import ChatCodec
    from verlx.rollout.agent.loop_config import agent_loop_class
    from verlx.rollout.agent.tool_config import load_tools

    default = rollout.agent.default_agent_loop
    names = dataset.column("agent_name")
    names = [default] * len(dataset) if names is None else [str(n) if n else default for n in names]
    f, tool_rows, asking_rows = Findings(), [], []
    for name in sorted(set(names)):
        try:
            cls = agent_loop_class(name, rollout.agent.agent_loop_config_path)
        except (KeyError, ValueError, TypeError) as e:
            f.problems.append(f"{which}: column agent_name: {e}")
            continue
        if cls.uses_tools and f.require(
                mt.enable, f"{which}: column agent_name: {name} calls tools, which needs {KEY}.enable=true"):
            tool_rows += [i for i, n in enumerate(names) if n == name]
        if cls.asks_interaction and mt.interaction_config_path:
            asking_rows += [i for i, n in enumerate(names) if n == name]
    f.problems += _interaction_row_problems(mt.interaction_config_path, dataset, asking_rows, which)
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


def _interaction_row_problems(path: str | None, dataset, rows: list[int], which: str, shown: int = 5) -> list[str]:
    """The rows (of those whose loop asks an interaction) whose extra_info.interaction_kwargs names none of the
    interaction file's entries: one problem naming the first row, why, and the first `shown` such rows."""
    if not rows or not path:
        return []
    from verlx.rollout.agent.interaction_config import load_interactions
    from verlx.rollout.agent.interactions import row_interaction_problem

    try:
        names = sorted(load_interactions(path))
    except ValueError:
        return []  # the config check reports the file
    extra = dataset.column("extra_info")
    if extra is None:
        extra = [None] * len(dataset)
    bad = [(i, why) for i in rows if (why := row_interaction_problem(extra[i], names)) is not None]
    if not bad:
        return []
    first, why = bad[0]
    return [f"{which}: row {first} of the loaded data: {why} ({KEY}={path}); {len(bad)} of the {len(rows)} rows "
            f"the interactions answer are so (rows {[i for i, _ in bad[:shown]]}{', ...' if len(bad) > shown else ''})"]
