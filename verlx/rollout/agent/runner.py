"""A batch of prompts → agent-loop trajectories (one coroutine per sample) → the shared rollout batch layout.

Used for every batch when rollout.mode=async (veRL's agent-loop rollout) or multi_turn.enable=true. Inputs
(non-tensor columns the driver passes): `raw_prompt` (the messages; data.return_raw_chat=true; needed by loops
that use tools), `agent_name` (optional; default rollout.agent.default_agent_loop), `extra_info` (its
`tools_kwargs` go to the tools). Output: prompts (re-rendered with the tools' schemas for loops that use tools),
responses with every turn, response_mask 1 on model tokens only, attention_mask 1 on every real token,
rollout_log_probs on model tokens; with multi_turn.enable also per-sample `multi_turn_*` columns the driver turns
into metrics (without it the columns are exactly those of a synchronous generate).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import numpy as np
import torch

from verlx.protocol import DataProto
from verlx.rollout.agent.chat import ChatCodec
from verlx.rollout.agent.driver import StreamDriver
from verlx.rollout.agent.execution import ToolExecutor
from verlx.rollout.agent.interaction_config import load_interactions
from verlx.rollout.agent.interactions import InteractionSession, interaction_kwargs, row_interaction_problem
from verlx.rollout.agent.loop_config import agent_loop_class
from verlx.rollout.agent.loops import AgentEnv, AgentLoop, AgentSample
from verlx.rollout.agent.oversampling import finish_first, samples_to_keep
from verlx.rollout.agent.parsers import TOOL_PARSERS
from verlx.rollout.agent.tool_config import load_tools
from verlx.rollout.agent.trajectory import Trajectory
from verlx.rollout.base import resolve_sampling
from verlx.rollout.stream import RequestStream
from verlx.utils.errors import VerlxError

logger = logging.getLogger(__name__)
SAMPLE_COLUMNS = ("num_turns", "user_turns", "tool_calls", "tool_errors", "tool_timeouts", "tool_malformed",
                  "tool_truncated", "tool_latency_s", "template_mismatch", "template_rewrite", "stop_reason",
                  "turn_scores", "messages")


class TemplateMismatchError(VerlxError, RuntimeError):
    """multi_turn.on_template_mismatch=error and a trajectory disagrees with the chat template."""


class AgentLoopRunner:
    def __init__(self, rollout_config, tokenizer, stop_token_ids: list[int], pad_token_id: int,
                 template_kwargs: dict | None = None, tools: dict | None = None, interactions: dict | None = None):
        self.config = rollout_config
        self.mt = rollout_config.multi_turn
        self.tokenizer = tokenizer
        self.stop_token_ids = list(stop_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.template_kwargs = dict(template_kwargs or {})
        if tools is None:
            tools = load_tools(self.mt.tool_config_path) if self.mt.tool_config_path else {}
        self.tools = tools
        if interactions is None:
            path = self.mt.interaction_config_path
            interactions = load_interactions(path) if path else {}
        self.interactions = interactions
        self.parser = TOOL_PARSERS.get(self.mt.format)
        self.schemas = [t.schema for t in self.tools.values()]

    # ------------------------------------------------------------------ entry points
    def generate(self, engine, prompts: DataProto) -> DataProto:
        """Generate `prompts` (left-padded, with the agent columns) through the engine's request stream, where the
        engine makes its requests (RolloutEngine.drive)."""
        params = resolve_sampling(self.config, prompts.meta_info, self.stop_token_ids)
        return engine.drive(lambda: self.generate_with(engine.open_stream(params), prompts, params.n))

    def generate_with(self, stream: RequestStream, prompts: DataProto, n: int) -> DataProto:
        keep = self._samples_to_keep(prompts.meta_info, len(prompts) * n)
        driver = StreamDriver(stream, n)
        trajectories = driver.run(lambda: self.run_samples(driver, prompts, n, keep))
        return self.build_batch(prompts, trajectories, n)

    def _samples_to_keep(self, meta_info: dict, total: int) -> int | None:
        """over_sample_rate: how many samples to wait for in a training call (None: all of them)."""
        rate = float(self.config.over_sample_rate)
        sampled = meta_info.get("do_sample", self.config.do_sample)
        if rate <= 0 or meta_info.get("validate", False) or not sampled:
            return None
        return samples_to_keep(total, rate)

    async def run_samples(self, driver: StreamDriver, prompts: DataProto, n: int,
                          keep: int | None = None) -> list[Trajectory]:
        """Every sample's agent loop, concurrently; with `keep`, the samples still running once `keep` have
        finished are cancelled (over_sample_rate) and come back with an empty response, stop reason
        `cancelled`."""
        executor = ToolExecutor(self.tools, self.mt.tool_timeout_s, self.mt.max_parallel_calls,
                                self.mt.max_tool_response_length, self.mt.tool_response_truncate_side,
                                threads=int(self.config.agent.num_workers))
        loops: dict[str, AgentLoop] = {}
        await driver.start()
        try:
            rows = _prompt_rows(prompts)
            samples = [self._prepare(driver, executor, loops, prompts, rows[i], i, i * n + j)
                       for i in range(len(prompts)) for j in range(n)]
            tasks = [asyncio.create_task(self._run_one(*sample)) for sample in samples]
            if keep is None or keep >= len(tasks):
                trajectories = list(await asyncio.gather(*tasks))
            else:
                cancelled = await finish_first(tasks, keep, driver.cut)
                trajectories = [_cancelled(sample[1].trajectory, prompts, sample[3] // n) if gone else task.result()
                                for sample, task, gone in zip(samples, tasks, cancelled)]
        finally:
            await driver.stop()
            executor.close()
        engine_error = driver.error
        if engine_error is not None:
            raise RuntimeError(f"the rollout engine failed during the agent-loop batch: {engine_error}") \
                from engine_error
        failed = [t for t in trajectories if t.stop_reason == "error" and not t.template_mismatch]
        if failed and len(failed) == len(trajectories):
            raise RuntimeError(f"every agent loop of the batch failed; the first: {failed[0].mismatch_detail}")
        return trajectories

    # ------------------------------------------------------------------ one sample
    def _loop(self, loops: dict[str, AgentLoop], name: str, executor: ToolExecutor) -> AgentLoop:
        if name not in loops:
            cls = agent_loop_class(name, self.config.agent.agent_loop_config_path)
            if cls.uses_tools and not self.mt.enable:
                raise ValueError(f"agent loop {name!r} calls tools, which needs "
                                 "actor_rollout_ref.rollout.multi_turn.enable=true (and multi_turn.tool_config_path)")
            codec = ChatCodec(self.tokenizer, self.schemas if cls.uses_tools else None, self.template_kwargs,
                              self.stop_token_ids)
            env = AgentEnv(codec, executor, self.parser, self.mt, frozenset(self.stop_token_ids))
            loops[name] = cls(env)
        return loops[name]

    def _prepare(self, driver, executor, loops, prompts: DataProto, row_ids: list[int], i: int,
                 index: int) -> tuple[AgentLoop, AgentSample, str, int]:
        """The loop of sample `index` (of row i, whose prompt ids are `row_ids`) and its starting state (the prompt
        rendered again with the tools' schemas for loops that use tools)."""
        nt = prompts.non_tensor_batch
        default = self.config.agent.default_agent_loop
        name = str(nt["agent_name"][i]) if "agent_name" in nt and nt["agent_name"][i] else default
        loop = self._loop(loops, name, executor)
        messages = _messages(nt["raw_prompt"][i]) if "raw_prompt" in nt else None
        if loop.uses_tools:
            if messages is None:
                raise ValueError(f"agent loop {name!r} renders the conversation itself and needs the prompt "
                                 "messages: set data.return_raw_chat=true")
            prompt_ids = loop.env.codec.prompt_ids(messages)
            if len(prompt_ids) > self.config.prompt_length:
                raise ValueError(f"sample {index}: the prompt rendered with the tools' schemas has {len(prompt_ids)} "
                                 f"tokens, more than data.max_prompt_length={self.config.prompt_length}; raise it")
        else:
            prompt_ids = row_ids
        traj = Trajectory(prompt_ids, int(self.config.response_length), messages=list(messages or []))
        extra = nt["extra_info"][i] if "extra_info" in nt else None
        tools_kwargs = (extra.get("tools_kwargs") if isinstance(extra, dict) else None) or {}
        session = self._interaction(extra, index) if loop.asks_interaction and self.interactions else None

        async def generate(ids, max_new, turn):
            out = await driver.generate(ids, max_new, (index, turn))
            if len(out.token_ids) > max_new:
                raise RuntimeError(f"the engine returned {len(out.token_ids)} tokens for max_new_tokens={max_new}")
            return out

        return loop, AgentSample(loop.env, traj, generate, tools_kwargs, extra, session), name, index

    def _interaction(self, extra_info, index: int) -> InteractionSession:
        """The sample's session with the interaction its row names (the data check before Ray names bad rows)."""
        problem = row_interaction_problem(extra_info, sorted(self.interactions))
        if problem is not None:
            raise ValueError(f"sample {index}: {problem} (multi_turn.interaction_config_path="
                             f"{self.mt.interaction_config_path})")
        kwargs = interaction_kwargs(extra_info)
        return InteractionSession(self.interactions[kwargs["name"]], kwargs)

    async def _run_one(self, loop: AgentLoop, sample: AgentSample, name: str, index: int) -> Trajectory:
        traj = sample.trajectory
        try:
            if sample.interaction is not None:
                await sample.interaction.start()
            await loop.run(sample)
        except Exception as e:  # a failing loop (template, interaction) loses its sample, not the batch
            logger.warning("agent loop %s failed on sample %d: %s: %s", name, index, type(e).__name__, e)
            traj.mismatch_detail = f"{type(e).__name__}: {e}"
            traj.stop_reason = "error"
        finally:
            if sample.interaction is not None:
                await sample.interaction.finish()
        if not traj.stop_reason:
            traj.stop_reason = "answered"
        if any(not s.is_model for s in traj.segments) and not traj.template_mismatch:
            self._check(loop, traj, index)
        return traj

    def _check(self, loop: AgentLoop, traj: Trajectory, index: int) -> None:
        segments = [(traj.prompt_ids, False)] + [(s.ids, s.is_model) for s in traj.segments]
        result = loop.env.codec.check_trajectory(traj.messages, segments)
        traj.template_rewrite = result.rewrite
        if result.mismatch:
            traj.template_mismatch, traj.mismatch_detail = True, result.detail
            if self.mt.on_template_mismatch == "error":
                raise TemplateMismatchError(
                    f"sample {index}: {result.detail}. The trajectory's tokens disagree with the chat template's "
                    "re-tokenisation (multi_turn.on_template_mismatch=error); see docs/multi_turn.md")
            logger.warning("sample %d excluded from training (multi_turn/template_mismatch): %s", index,
                           result.detail)

    # ------------------------------------------------------------------ the batch
    def build_batch(self, prompts: DataProto, trajectories: list[Trajectory], n: int) -> DataProto:
        prompt_width, width = int(self.config.prompt_length), int(self.config.response_length)
        prompt_ids, prompt_mask = _pack([t.prompt_ids for t in trajectories], prompt_width, self.pad_token_id,
                                        left=True)
        parts = [t.response() for t in trajectories]
        responses, valid = _pack([p[0] for p in parts], width, self.pad_token_id, left=False)
        model_mask, _ = _pack([p[1] for p in parts], width, 0, left=False)
        excluded = torch.tensor([t.template_mismatch or t.stop_reason in ("error", "cancelled") for t in trajectories])
        response_mask = model_mask * (~excluded)[:, None]
        prompt_pos = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
        response_pos = prompt_pos[:, -1:] + torch.arange(1, width + 1)
        batch = {
            "prompts": prompt_ids, "responses": responses, "response_mask": response_mask,
            "input_ids": torch.cat([prompt_ids, responses], -1),
            "attention_mask": torch.cat([prompt_mask, valid], -1),
            "position_ids": torch.cat([prompt_pos, response_pos], -1),
        }
        if self.config.calculate_log_probs:
            lps = torch.zeros(len(parts), width, dtype=torch.float32)
            lps[valid.bool()] = torch.tensor(list(itertools.chain.from_iterable(p[2] for p in parts)),
                                             dtype=torch.float32)
            batch["rollout_log_probs"] = lps * response_mask
        device = prompts.batch["input_ids"].device
        batch = {k: v.to(device) for k, v in batch.items()}
        columns = sample_columns(trajectories) if self.mt.enable else {}
        return DataProto(batch, columns, dict(prompts.meta_info))


def sample_columns(trajectories: list[Trajectory]) -> dict[str, np.ndarray]:
    values = {
        "num_turns": [t.assistant_turns for t in trajectories],
        "user_turns": [t.user_turns for t in trajectories],
        "tool_calls": [t.tool_calls for t in trajectories],
        "tool_errors": [t.tool_errors for t in trajectories],
        "tool_timeouts": [t.tool_timeouts for t in trajectories],
        "tool_malformed": [t.tool_malformed for t in trajectories],
        "tool_truncated": [t.tool_truncated for t in trajectories],
        "tool_latency_s": [sum(t.tool_latency_s) for t in trajectories],
        "template_mismatch": [t.template_mismatch for t in trajectories],
        "template_rewrite": [t.template_rewrite for t in trajectories],
        "stop_reason": [t.stop_reason for t in trajectories],
    }
    out = {f"multi_turn_{k}": np.asarray(v, dtype=object) for k, v in values.items()}
    for column, per_sample in (("turn_scores", [t.turn_scores for t in trajectories]),
                               ("messages", [t.messages for t in trajectories])):
        lists = np.empty(len(trajectories), dtype=object)  # one list per sample (np.asarray would nest them)
        for k, value in enumerate(per_sample):
            lists[k] = list(value)
        out[f"multi_turn_{column}"] = lists
    return out


def _cancelled(started: Trajectory, prompts: DataProto, row: int) -> Trajectory:
    """What a sample cancelled by over_sample_rate becomes: its prompt, no response (veRL's padding sample)."""
    nt = prompts.non_tensor_batch
    messages = _messages(nt["raw_prompt"][row]) if "raw_prompt" in nt else []
    return Trajectory(started.prompt_ids, started.budget, messages=messages, stop_reason="cancelled")


def _pack(rows: list[list], width: int, pad: int, left: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows padded to `width` (on the left or right) → (values [N, width], mask of real entries)."""
    lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
    cols = torch.arange(width)[None, :]
    mask = cols >= (width - lengths)[:, None] if left else cols < lengths[:, None]
    values = torch.full((len(rows), width), pad, dtype=torch.long)
    values[mask] = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.long)
    return values, mask.long()


def _prompt_rows(prompts: DataProto) -> list[list[int]]:
    """Every row's real (unpadded) prompt ids, with one device-to-host copy."""
    ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].cpu().bool()
    return [row[m].tolist() for row, m in zip(ids, mask)]


def _messages(raw: Any) -> list[dict]:
    return [dict(m) for m in list(raw)]
