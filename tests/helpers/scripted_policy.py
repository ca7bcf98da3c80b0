"""An engine double for the agent loop: each sample's model turns are fixed token sequences (test-only).

A turn longer than the request's max_new_tokens is cut there (as an engine would stop at the limit). Every
token gets a log-prob that is a known function of (token, position in the turn), so tests can check that
rollout log-probs land on exactly the model's tokens. Every request's context is recorded.
"""

from __future__ import annotations

import asyncio

import numpy as np
import torch

from verlx.config.roles import AgentLoopConfig, MultiTurnConfig, RolloutConfig
from verlx.protocol import DataProto
from verlx.rollout.agent.backends import GenerationBackend, GenOutput
from verlx.rollout.base import SamplingParams


def scripted_logprob(token: int, position: int) -> float:
    return -((token % 13) + 1) / 8 - position / 1000


class ScriptedBackend(GenerationBackend):
    def __init__(self, turns: dict[int, list[list[int]]], stop_ids: list[int], delay_s: float = 0.0):
        super().__init__(None, SamplingParams(), want_log_probs=True)
        self.turns, self.stop_ids, self.delay_s = turns, set(stop_ids), delay_s
        self.requests: list[tuple[int, int, list[int], int]] = []

    async def generate(self, ids, max_new_tokens, key) -> GenOutput:
        sample, turn = key
        self.requests.append((sample, turn, list(ids), max_new_tokens))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        script = self.turns[sample]
        out = list(script[min(turn, len(script) - 1)])[:max_new_tokens]
        reason = "stop" if out and out[-1] in self.stop_ids else "length"
        return GenOutput(out, [scripted_logprob(t, i) for i, t in enumerate(out)], reason)


def rollout_config(prompt_length: int = 2048, response_length: int = 512,
                   default_agent_loop: str = "single_turn_agent", **multi_turn) -> RolloutConfig:
    config = RolloutConfig(prompt_length=prompt_length, response_length=response_length, calculate_log_probs=True)
    config.multi_turn = MultiTurnConfig(enable=True, **multi_turn)
    config.agent = AgentLoopConfig(default_agent_loop=default_agent_loop)
    return config


def prompt_batch(tokenizer, conversations: list[list[dict]], agent_names=None, extra_infos=None,
                 width: int = 1024) -> DataProto:
    """Left-padded prompts (rendered without tools) with raw_prompt / agent_name / extra_info columns."""
    rows = [tokenizer(tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=False),
                      add_special_tokens=False)["input_ids"] for c in conversations]
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    nt = {"raw_prompt": _objects(conversations)}
    if agent_names is not None:
        nt["agent_name"] = _objects(agent_names)
    if extra_infos is not None:
        nt["extra_info"] = _objects(extra_infos)
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                     nt, {})


def _objects(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out
