"""An engine double for the agent loop: each sample's model turns are fixed token sequences (test-only).

A turn longer than the request's max_new_tokens is cut there (as an engine would stop at the limit). Every
token gets a log-prob that is a known function of (token, position in the turn), so tests can check that
rollout log-probs land on exactly the model's tokens. Every request's context is recorded.
"""

from __future__ import annotations

import numpy as np
import torch

from verlx.config.roles import AgentLoopConfig, MultiTurnConfig, RolloutConfig
from verlx.protocol import DataProto
from verlx.rollout.base import SamplingParams
from verlx.rollout.stream import Finished, RequestStream, StreamLimits

UNLIMITED = StreamLimits(response_length=10**6, max_model_len=10**7)


def scripted_logprob(token: int, position: int) -> float:
    return -((token % 13) + 1) / 8 - position / 1000


class ScriptedStream(RequestStream):
    """Every request submitted before a step finishes in that step with its sample's scripted turn."""

    def __init__(self, turns: dict[int, list[list[int]]], stop_ids: list[int]):
        super().__init__(SamplingParams(), UNLIMITED, want_log_probs=True)
        self.turns, self.stop_ids = turns, set(stop_ids)
        self.requests: list[tuple[int, int, list[int], int]] = []
        self.pending: list[tuple[str, int, int, int]] = []

    def _submit(self, key, prompt_ids, max_new_tokens, seed, follows):
        sample, turn = (int(x) for x in key.split("/"))
        self.requests.append((sample, turn, list(prompt_ids), max_new_tokens))
        self.pending.append((key, sample, turn, max_new_tokens))

    def _step(self):
        done, self.pending = self.pending, []
        out = []
        for key, sample, turn, max_new_tokens in done:
            script = self.turns[sample]
            tokens = list(script[min(turn, len(script) - 1)])[:max_new_tokens]
            reason = "stop" if tokens and tokens[-1] in self.stop_ids else "length"
            out.append(Finished(key, tokens, [scripted_logprob(t, i) for i, t in enumerate(tokens)], reason))
        return out

    def _cancel(self, keys):
        self.pending = [p for p in self.pending if p[0] not in keys]
        return [Finished(key, [], [], "abort") for key in keys]


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


def enc(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def scripted_response(tok, segments: list[tuple[str, bool]]) -> tuple[list[int], list[int], list[float]]:
    """The response ids, loss mask and rollout log-probs of a trajectory made of `segments` (text, written by the
    model): the model's tokens carry the scripted policy's log-probs, the rest (tool results, user turns) 0."""
    ids, mask, lps = [], [], []
    for text, is_model in segments:
        part = enc(tok, text)
        ids += part
        mask += [int(is_model)] * len(part)
        lps += [scripted_logprob(t, i) if is_model else 0.0 for i, t in enumerate(part)]
    return ids, mask, lps


def response(batch, row: int) -> tuple[list[int], list[int], list[float]]:
    """A rollout row's response ids, loss mask and rollout log-probs, padding dropped."""
    mask = batch.batch["attention_mask"][row, batch.batch["prompts"].shape[1]:].bool()
    return (batch.batch["responses"][row][mask].tolist(), batch.batch["response_mask"][row][mask].tolist(),
            batch.batch["rollout_log_probs"][row][mask].tolist())


def assert_row(batch, row: int, want: tuple[list[int], list[int], list[float]]) -> None:
    import pytest

    ids, mask, lps = response(batch, row)
    assert ids == want[0]
    assert mask == want[1]
    assert lps == pytest.approx(want[2], abs=1e-6)
