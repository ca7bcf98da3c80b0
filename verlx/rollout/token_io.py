"""Token-level I/O of engines that take and return Python token lists (SGLang, vLLM).

In: the left-padded prompt batch becomes one list of prompt token ids per row (the engines take ids, so nothing
is re-tokenised). Out: per-sample generated ids and log-probs become the shared rollout layout, right-padded to
rollout.response_length. The engines hand back Python objects, so reading them is host work; the packing into
tensors happens in one vectorised step per batch.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import torch

from verlx.protocol import DataProto
from verlx.rollout.base import build_rollout_batch
from verlx.utils.errors import VerlxError

#: finish reasons every engine reports for a completed sample
FINISHED = ("stop", "length")


class EngineGenerationError(VerlxError, RuntimeError):
    """The engine returned something other than a completed sample for every request."""


@dataclass
class GenerationResult:
    """Engine output for one batch, samples ordered [p0s0, p0s1, ..., p1s0, ...]."""

    token_ids: list[list[int]]
    log_probs: list[list[float]] | None
    finish_reasons: list[str]

    def __post_init__(self) -> None:
        if len(self.finish_reasons) != len(self.token_ids):
            raise ValueError(f"{len(self.token_ids)} samples but {len(self.finish_reasons)} finish reasons")
        if self.log_probs is not None:
            if len(self.log_probs) != len(self.token_ids):
                raise ValueError(f"{len(self.token_ids)} samples but {len(self.log_probs)} log-prob lists")
            for i, (ids, lps) in enumerate(zip(self.token_ids, self.log_probs)):
                if len(ids) != len(lps):
                    raise EngineGenerationError(f"sample {i}: {len(ids)} tokens but {len(lps)} log-probs")


def prompt_token_lists(prompts: DataProto) -> list[list[int]]:
    """The real (unpadded) token ids of each row of a left-padded prompt batch."""
    input_ids = prompts.batch["input_ids"]
    mask = prompts.batch["attention_mask"].bool()
    if input_ids.dim() != 2 or mask.shape != input_ids.shape:
        raise ValueError(f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(mask.shape)} must be [B, P]")
    right_padded = (mask[:, :-1] & ~mask[:, 1:]).any(-1)
    lengths = mask.sum(-1)
    bad = torch.nonzero(right_padded | (lengths == 0)).flatten()
    if bad.numel():
        row = int(bad[0])
        raise ValueError(
            f"prompt row {row}: attention_mask is not left-padded or has no token ({mask[row].int().tolist()}); "
            "engines take a non-empty sequence padded on the left"
        )
    rows, lens = input_ids.tolist(), lengths.tolist()
    return [row[len(row) - n :] for row, n in zip(rows, lens)]


def require_finished(engine: str, index: int, reason: str, message: str = "") -> None:
    """Raise when the engine aborted (or did not finish) a sample, instead of training on a truncated one."""
    if reason not in FINISHED:
        detail = f": {message}" if message else ""
        raise EngineGenerationError(f"{engine} did not finish sample {index} (finish reason {reason!r}){detail}")


def require_full_length(engine: str, result: GenerationResult, max_new_tokens: int) -> None:
    """Raise when the engine stopped a sample for length before max_new_tokens: it clipped the request (its
    context length too short for prompt + response), and the run would train on silently shortened responses."""
    for i, (ids, reason) in enumerate(zip(result.token_ids, result.finish_reasons)):
        if reason == "length" and len(ids) < max_new_tokens:
            raise EngineGenerationError(
                f"{engine} stopped sample {i} for length after {len(ids)} of max_new_tokens={max_new_tokens} "
                f"tokens: the engine clipped the request (its context length is shorter than prompt + response); "
                f"raise actor_rollout_ref.rollout.max_model_len or leave it null"
            )


def pack_responses(
    result: GenerationResult, response_length: int, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(responses [N, R] right-padded with pad_token_id, response_mask [N, R], log-probs [N, R] or None)."""
    lengths = torch.tensor([len(ids) for ids in result.token_ids], dtype=torch.long)
    too_long = torch.nonzero(lengths > response_length).flatten()
    if too_long.numel():
        i = int(too_long[0])
        raise EngineGenerationError(
            f"sample {i} has {int(lengths[i])} tokens, more than actor_rollout_ref.rollout.response_length="
            f"{response_length}; max_new_tokens must not exceed it"
        )
    mask = torch.arange(response_length).unsqueeze(0) < lengths.unsqueeze(1)
    responses = torch.full(mask.shape, pad_token_id, dtype=torch.long)
    responses[mask] = torch.tensor(list(itertools.chain.from_iterable(result.token_ids)), dtype=torch.long)
    log_probs = None
    if result.log_probs is not None:
        log_probs = torch.zeros(mask.shape, dtype=torch.float32)
        log_probs[mask] = torch.tensor(list(itertools.chain.from_iterable(result.log_probs)), dtype=torch.float32)
    return responses, mask.long(), log_probs


def rollout_batch_from_result(
    prompts: DataProto, result: GenerationResult, n: int, response_length: int, pad_token_id: int
) -> DataProto:
    """The shared rollout layout (build_rollout_batch) for an engine's token-list output."""
    expected = len(prompts) * n
    if len(result.token_ids) != expected:
        raise EngineGenerationError(
            f"engine returned {len(result.token_ids)} samples for {len(prompts)} prompts × n={n} = {expected}"
        )
    responses, mask, log_probs = pack_responses(result, response_length, pad_token_id)
    device = prompts.batch["input_ids"].device
    return build_rollout_batch(
        prompts,
        responses.to(device),
        mask.to(device),
        None if log_probs is None else log_probs.to(device),
        n,
    )
