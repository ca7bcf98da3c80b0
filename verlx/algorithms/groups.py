"""Per-group statistics of one scalar per sample, vectorised with scatter ops (batches hold thousands of samples).

A group is the set of samples generated from one prompt: rows sharing a `uid`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def group_ids(index, device: torch.device | str | None = None) -> tuple[torch.Tensor, int]:
    """Dense ids 0..G-1 for any per-row labels (uid strings, ints, ...) and the number of groups G."""
    labels = np.asarray(index)
    if labels.ndim != 1:
        raise ValueError(f"group index must be 1-D (one uid per row), got shape {labels.shape}")
    try:
        uniques, inverse = np.unique(labels, return_inverse=True)
    except TypeError:  # unorderable mix of types: group by their string form
        uniques, inverse = np.unique(labels.astype(str), return_inverse=True)
    return torch.from_numpy(inverse.reshape(-1).astype(np.int64)).to(device), len(uniques)


@dataclass
class GroupStats:
    """Per-sample views of its group's statistics (shape [B] each)."""

    count: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor  # unbiased; 0 for groups of one

    @property
    def singleton(self) -> torch.Tensor:
        return self.count < 2


def _scatter_sum(values: torch.Tensor, ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros(num_groups, dtype=values.dtype, device=values.device).index_add_(0, ids, values)


def group_stats(scores: torch.Tensor, ids: torch.Tensor, num_groups: int) -> GroupStats:
    """Count, mean and unbiased std of `scores` [B] within each group, broadcast back to the samples."""
    count = _scatter_sum(torch.ones_like(scores), ids, num_groups)
    mean = _scatter_sum(scores, ids, num_groups) / count.clamp(min=1)
    centered = scores - mean[ids]
    sq = _scatter_sum(centered * centered, ids, num_groups)
    std = torch.sqrt(sq / (count - 1).clamp(min=1))
    return GroupStats(count=count[ids], mean=mean[ids], std=std[ids])


def uniform_groups(values: torch.Tensor, ids: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per group: whether all its values are equal (a group whose group-relative advantages are all 0), and its
    sample count; both shape [G]."""
    values = values.double()
    low = torch.full((num_groups,), torch.inf, dtype=values.dtype, device=values.device)
    high = torch.full((num_groups,), -torch.inf, dtype=values.dtype, device=values.device)
    low = low.scatter_reduce(0, ids, values, "amin")
    high = high.scatter_reduce(0, ids, values, "amax")
    return high <= low, torch.bincount(ids, minlength=num_groups)


def group_weighted_mean(scores: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor,
                        num_groups: int) -> torch.Tensor:
    """sum(w * s) / sum(w) within each group, per sample (0 where a group's weights sum to 0)."""
    num = _scatter_sum(weights * scores, ids, num_groups)
    den = _scatter_sum(weights, ids, num_groups)
    return (num / torch.where(den != 0, den, torch.ones_like(den)))[ids]


def group_best_and_runner_up(scores: torch.Tensor, ids: torch.Tensor, num_groups: int):
    """Per sample: whether it is its group's best (the first row among ties), and the group's best and second-best
    scores (second-best is -inf in a group of one)."""
    rows = torch.arange(scores.shape[0], device=scores.device)
    best = torch.full((num_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
    best = best.scatter_reduce(0, ids, scores, reduce="amax")
    at_best = scores == best[ids]
    first_best_row = torch.full((num_groups,), scores.shape[0], dtype=torch.long, device=scores.device)
    first_best_row = first_best_row.scatter_reduce(0, ids[at_best], rows[at_best], reduce="amin")
    is_best = rows == first_best_row[ids]
    others = torch.where(is_best, torch.full_like(scores, -torch.inf), scores)
    runner_up = torch.full((num_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
    runner_up = runner_up.scatter_reduce(0, ids, others, reduce="amax")
    return is_best, best[ids], runner_up[ids]
