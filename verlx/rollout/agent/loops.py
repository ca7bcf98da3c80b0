"""Agent loops: how one sample's conversation proceeds. Registry AGENT_LOOPS: `single_turn_agent`, `tool_agent`
(veRL's names), or a user's own `package.module:Class` (a subclass of AgentLoop) named in the sample's
`agent_name` column or in rollout.agent.default_agent_loop.

A loop only decides *what* happens next; AgentSample does the token work (generate a model turn, append the
template's delta of tool/user messages within the budget), so every loop is token-exact by construction.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from verlx.rollout.agent.chat import ChatCodec, TemplateDeltaError
from verlx.rollout.agent.execution import ToolExecutor, ToolOutcome
from verlx.rollout.agent.interactions import InteractionSession
from verlx.rollout.agent.trajectory import Trajectory
from verlx.utils.registry import Registry

AGENT_LOOPS: Registry[type[AgentLoop]] = Registry("agent loop", "agent_name (data column)", import_paths=True)


@dataclass
class ModelTurn:
    ids: list[int]
    text: str  # the turn decoded without its stop token (for parsing only; never re-encoded)
    finish_reason: str  # stop | length


@dataclass
class AgentEnv:
    """What every sample of a batch shares."""

    codec: ChatCodec
    executor: ToolExecutor
    parser: Any  # a TOOL_PARSERS entry
    config: Any  # MultiTurnConfig
    stop_token_ids: frozenset[int]


class AgentSample:
    """One sample's state and the token-level operations a loop may use."""

    def __init__(self, env: AgentEnv, trajectory: Trajectory, generate, tools_kwargs: dict, extra_info: Any,
                 interaction: InteractionSession | None = None):
        self.env = env
        self.trajectory = trajectory
        self._generate = generate  # async (context ids, max_new_tokens, turn) -> rollout.stream.Finished
        self.tools_kwargs = tools_kwargs
        self.extra_info = extra_info
        self.interaction = interaction  # the row's simulated user (multi_turn.interaction_config_path), if any

    @property
    def messages(self) -> list[dict]:
        return self.trajectory.messages

    def stop(self, reason: str) -> None:
        if not self.trajectory.stop_reason:
            self.trajectory.stop_reason = reason

    async def generate(self, max_new_tokens: int | None = None) -> ModelTurn | None:
        """The next model turn (at most max_new_tokens, and never past the response budget), appended to the
        trajectory; None (and stop 'length') when no budget is left."""
        traj = self.trajectory
        if traj.remaining <= 0:
            self.stop("length")
            return None
        limit = traj.remaining if max_new_tokens is None else min(traj.remaining, int(max_new_tokens))
        out = await self._generate(traj.context_ids, limit, traj.assistant_turns)
        ids = out.token_ids
        traj.add_model(ids, out.log_probs)
        stopped = bool(ids) and ids[-1] in self.env.stop_token_ids
        text = self.env.codec.decode(ids[:-1] if stopped else ids)
        traj.messages.append({"role": "assistant", "content": text})
        return ModelTurn(list(ids), text, "stop" if stopped else "length")

    def append_messages(self, messages: list[dict]) -> bool:
        """Append tool/user messages as the template's delta (ending in the next generation prompt). False, with
        the stop reason set, when they do not fit the budget or the template has no append-only delta."""
        try:
            ids = self.env.codec.delta_ids(messages)
        except TemplateDeltaError as e:
            self.trajectory.template_mismatch = True
            self.trajectory.mismatch_detail = str(e)
            self.stop("error")
            return False
        if not self.trajectory.fits(ids):
            self.stop("context_over_budget")
            return False
        self.trajectory.add_context(ids)
        self.trajectory.messages.extend(messages)
        return True


class AgentLoop:
    """Subclass and implement `run`; `env` is shared by the batch. Register with @AGENT_LOOPS.register(name) or
    write `package.module:Class` into the data's agent_name column. With `uses_tools`, the prompt is rendered
    again from the messages with the tools' schemas (the template puts them in the system prompt). With
    `asks_interaction`, each sample is given its row's interaction (multi_turn.interaction_config_path) as
    `sample.interaction`."""

    uses_tools = False
    asks_interaction = False

    def __init__(self, env: AgentEnv):
        self.env = env

    async def run(self, sample: AgentSample) -> None:
        raise NotImplementedError

    async def user_reply(self, sample: AgentSample) -> str | None:
        """A user's next message after the model answered without calling a tool (None: the conversation ends).
        Override for simulated users; bounded by multi_turn.max_user_turns."""
        return None


@AGENT_LOOPS.register("single_turn_agent")
class SingleTurnAgentLoop(AgentLoop):
    """One model turn, exactly what the single-turn rollout does."""

    async def run(self, sample: AgentSample) -> None:
        turn = await sample.generate()
        if turn is not None:
            sample.stop("answered" if turn.finish_reason == "stop" else "length")


@AGENT_LOOPS.register("tool_agent")
class ToolAgentLoop(AgentLoop):
    """generate → parse tool calls → run them concurrently → append results → generate ..., until the model
    answers without a call, the budget or a turn limit is reached. An answer without a call goes to the row's
    interaction when there is one (veRL's tool agent loop), else to `user_reply`."""

    uses_tools = True
    asks_interaction = True

    async def run(self, sample: AgentSample) -> None:
        cfg, traj = self.env.config, sample.trajectory
        while True:
            turn = await sample.generate()
            if turn is None:
                return
            if turn.finish_reason == "length":
                return sample.stop("length")
            parsed = self.env.parser(turn.text)
            if not parsed.has_calls:
                if not await self.user_turn(sample):
                    return sample.stop("answered")
                continue
            if cfg.max_assistant_turns is not None and traj.assistant_turns >= cfg.max_assistant_turns:
                return sample.stop("max_assistant_turns")
            if user_turns_spent(cfg, traj):
                return sample.stop("max_user_turns")
            outcomes = await self.env.executor.run(parsed, sample.tools_kwargs)
            record_outcomes(traj, outcomes)
            traj.user_turns += 1  # veRL counts the tool results' turn as a user turn
            if not sample.append_messages([{"role": "tool", "content": o.text} for o in outcomes]):
                return

    async def user_turn(self, sample: AgentSample) -> bool:
        """After a model turn without tool calls: the user's turn (the row's interaction, else `user_reply`),
        appended; whether the conversation goes on (False: the stop reason says why, or the model answered)."""
        cfg, traj = self.env.config, sample.trajectory
        spent = user_turns_spent(cfg, traj)
        if sample.interaction is not None:
            if spent:  # veRL does not ask the interaction then
                sample.stop("max_user_turns")
                return False
            return await self._interaction_turn(sample)
        reply = await self.user_reply(sample)
        if reply is None:
            return False
        if spent:  # a user with more to say, stopped by the limit
            sample.stop("max_user_turns")
            return False
        traj.user_turns += 1
        return sample.append_messages([{"role": "user", "content": reply}])

    async def _interaction_turn(self, sample: AgentSample) -> bool:
        """veRL's order: no question after the last allowed model turn; the interaction's message is appended
        (masked out of the loss like tool results) even when it ends the conversation; its score is recorded."""
        cfg, traj = self.env.config, sample.trajectory
        if cfg.max_assistant_turns is not None and traj.assistant_turns >= cfg.max_assistant_turns:
            sample.stop("max_assistant_turns")
            return False
        reply = await sample.interaction.reply(sample.messages)
        traj.user_turns += 1
        if reply.score is not None:
            traj.turn_scores.append(reply.score)
        if not sample.append_messages([{"role": "user", "content": reply.text}]):
            return False
        if reply.terminate:
            sample.stop("interaction_ended")
            return False
        return True


def user_turns_spent(cfg, traj: Trajectory) -> bool:
    """veRL's rule: multi_turn.max_user_turns bounds the user turns, tool results' and simulated users' together;
    null or 0 is no limit."""
    return bool(cfg.max_user_turns) and traj.user_turns >= cfg.max_user_turns


def record_outcomes(traj: Trajectory, outcomes: list[ToolOutcome]) -> None:
    for o in outcomes:
        traj.tool_calls += 1
        traj.tool_errors += o.status == "error"
        traj.tool_timeouts += o.status == "timeout"
        traj.tool_malformed += o.status == "malformed"
        traj.tool_truncated += o.truncated
        if o.status in ("ok", "error", "timeout") and o.latency_s:
            traj.tool_latency_s.append(o.latency_s)
