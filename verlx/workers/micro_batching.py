"""Splitting a rank's samples into PPO mini-batches and those into micro-batches (by count, or by token budget
with equal counts on every rank): the one iterator every training engine's update runs over.

Token budgets (`*_max_token_len_per_gpu`) have veRL's meaning: the tokens one GPU holds. Under sequence parallelism
the GPUs of a group share each micro-batch, each holding a slice of its sequences, so a micro-batch holds up to
budget × the group's size tokens (utils.batch_sizes.sequence_split_size); without it, budget tokens.

FSDP runs collectives inside every forward, so all data-parallel ranks must run the same number of
micro-batches; the token-budget split therefore agrees on the count across the group first (small CPU
tensors: the process group has a gloo backend for CPU, see utils/distributed.py).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verlx.protocol import DataProto
from verlx.utils.batch_sizes import (
    budget_too_small,
    dynamic_batches,
    micro_batch_token_limit,
    sequence_split_size,
)
from verlx.workers.stats import global_counts


def sequence_lengths(data: DataProto) -> torch.Tensor:
    return data.batch["attention_mask"].sum(-1)


def balanced_partition(lengths: list[int], k: int) -> list[list[int]]:
    """Longest-processing-time greedy: k groups of indices with nearly equal length sums, each non-empty."""
    if k > len(lengths):
        raise ValueError(f"cannot make {k} non-empty groups from {len(lengths)} items")
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    heap = [(0, g) for g in range(k)]
    groups: list[list[int]] = [[] for _ in range(k)]
    for i in order:
        total, g = heapq.heappop(heap)
        groups[g].append(i)
        heapq.heappush(heap, (total + lengths[i], g))
    return [sorted(g) for g in groups]


def token_budget_micro_batches(
    data: DataProto, max_token_len: int, group: dist.ProcessGroup | None = None, key: str = "", split: int = 1
) -> tuple[list[DataProto], torch.Tensor]:
    """Micro-batches whose real-token sums fit the per-GPU budget `max_token_len` × `split` (the GPUs that share each
    micro-batch, see the module docstring), the same count on every rank of `group`.

    Returns the micro-batches and the permutation that was applied (outputs concatenated in micro-batch order
    are put back in the original order with `restore_order`).
    """
    lengths = sequence_lengths(data).tolist()
    longest = max(lengths)
    limit = micro_batch_token_limit(max_token_len, split)
    if longest > limit:
        raise ValueError(budget_too_small(key or "max_token_len_per_gpu", max_token_len, split, longest,
                                          f"the longest sequence ({longest} tokens: prompt + response)"))
    k = -(-sum(lengths) // limit)
    while True:
        k = _agree_on_max(k, group)
        k = min(max(k, 1), len(lengths))
        groups = balanced_partition(lengths, k)
        fits = all(sum(lengths[i] for i in g) <= limit for g in groups)
        if _all_ranks_true(fits, group) or k == len(lengths):
            break
        k += 1
    order = torch.tensor([i for g in groups for i in g])
    parts = [data[torch.tensor(g)] for g in groups]
    return parts, order


def restore_order(values: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Undo the permutation `order` applied along dim 0."""
    out = torch.empty_like(values)
    out[order] = values
    return out


def _agree_on_max(value: int, group) -> int:
    if not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


def _all_ranks_true(flag: bool, group) -> bool:
    if not dist.is_initialized():
        return flag
    t = torch.tensor([0 if flag else 1], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
    return int(t.item()) == 0


def micro_batches(
    data: DataProto, micro_batch_size: int | None, use_dynamic_bsz: bool | None, max_token_len: int | None, group=None,
    key="", split: int = 1
) -> tuple[list[DataProto], torch.Tensor | None]:
    """Fixed-size or token-budget micro-batches (utils.batch_sizes.dynamic_batches decides an unset flag); the
    permutation is None when order is kept. `max_token_len` is the per-GPU budget and `split` the GPUs that share
    each micro-batch (token_budget_micro_batches). An unset budget is the workers' to derive (workers/memory_plan)."""
    if dynamic_batches(use_dynamic_bsz, micro_batch_size):
        if max_token_len is None:
            raise ValueError(f"{key or 'max_token_len_per_gpu'} is unset: the workers derive it when they start "
                             "(workers/memory_plan); code that builds engines itself must set it")
        return token_budget_micro_batches(data, max_token_len, group, key, split)
    if not micro_batch_size or micro_batch_size <= 0:
        raise ValueError(f"micro-batch size must be positive (got {micro_batch_size}) when use_dynamic_bsz is false")
    return data.split(micro_batch_size), None


def gradient_accumulation(module, parts: list[DataProto], defer_reduce: bool):
    """Yield `parts` for forward + backward; with `defer_reduce`, an FSDP2 module reduce-scatters gradients only
    in the last part's backward (the others accumulate unsharded gradients: less communication, more memory)."""
    set_sync = getattr(module, "set_requires_gradient_sync", None) if defer_reduce else None
    for i, part in enumerate(parts):
        if set_sync is not None:
            set_sync(i == len(parts) - 1)
        yield part


@dataclass
class MiniBatch:
    """One optimizer step's samples on this rank, split into micro-batches; `counts` are the mini-batch's global
    token and sequence counts (workers/stats.global_counts) for exact loss aggregation."""

    micro_batches: list[DataProto]
    counts: dict[str, torch.Tensor]


def epoch_order(data: DataProto, role, epoch: int) -> DataProto:
    """The batch as PPO epoch `epoch` visits it: with `role.shuffle`, a permutation of the batch seeded by
    data_loader_seed + epoch (a function of the epoch alone, the same for every training backend)."""
    if not role.shuffle:
        return data
    g = torch.Generator().manual_seed(role.data_loader_seed + epoch)
    return data[torch.randperm(len(data), generator=g)]


def ppo_mini_batches(data: DataProto, role, mini_batch_size: int, micro_batch_size: int | None,
                     device: torch.device, key: str, dp_size: int | None = None) -> Iterator[MiniBatch]:
    """The one PPO update loop: `role.ppo_epochs` passes over `data` (epoch_order), each split into mini-batches of
    `mini_batch_size` samples, their global token counts, and micro-batches of `micro_batch_size` samples or of the
    per-GPU token budget `role.ppo_max_token_len_per_gpu` (use_dynamic_bsz; × the role's sequence-parallel size per
    micro-batch, sequence_split_size). `role` is an actor or critic config, `key` its
    config path (named in errors), `dp_size` the data-parallel size (global_counts). Collective: every rank
    iterates the same number of mini-batches."""
    for epoch in range(role.ppo_epochs):
        for mini in epoch_order(data, role, epoch).split(mini_batch_size):
            counts = global_counts(mini.batch["response_mask"], device, dp_size)
            parts, _ = micro_batches(mini, micro_batch_size, role.use_dynamic_bsz, role.ppo_max_token_len_per_gpu,
                                     key=f"{key}.ppo_max_token_len_per_gpu", split=sequence_split_size(role))
            yield MiniBatch(parts, counts)
