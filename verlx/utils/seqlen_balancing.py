"""Reordering a batch so every data-parallel rank gets about the same number of tokens."""

from __future__ import annotations

import torch

from verlx.protocol import DataProto


def equal_size_partition(lengths: list[int], k: int) -> list[list[int]]:
    """k groups of exactly len/k indices with balanced length sums (longest first, snake order)."""
    n = len(lengths)
    if n % k:
        raise ValueError(f"{n} sequences cannot be split into {k} equal groups")
    order = sorted(range(n), key=lambda i: -lengths[i])
    groups: list[list[int]] = [[] for _ in range(k)]
    for position, index in enumerate(order):
        lap, offset = divmod(position, k)
        groups[offset if lap % 2 == 0 else k - 1 - offset].append(index)
    return groups


def balance_batch(batch: DataProto, world_size: int) -> dict[str, float]:
    """Reorder `batch` in place so its dp shards have similar token counts; returns veRL's global_seqlen metrics."""
    lengths = batch.batch["attention_mask"].sum(-1).tolist()
    groups = equal_size_partition(lengths, world_size)
    batch.reorder(torch.tensor([i for g in groups for i in sorted(g)]))
    before = [sum(lengths[j] for j in range(r * len(lengths) // world_size, (r + 1) * len(lengths) // world_size))
              for r in range(world_size)]
    after = [sum(lengths[i] for i in g) for g in groups]
    return {
        "global_seqlen/min": float(min(before)),
        "global_seqlen/max": float(max(before)),
        "global_seqlen/minmax_diff": float(max(before) - min(before)),
        "global_seqlen/balanced_min": float(min(after)),
        "global_seqlen/balanced_max": float(max(after)),
        "global_seqlen/mean": float(sum(after) / world_size),
    }
