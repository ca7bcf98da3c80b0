"""How an SFT global batch is spread: over data-parallel shards (Ulysses groups of `sp` consecutive ranks share
one shard), and within a shard into micro-batches of a fixed row count or of a token budget.

Every process tokenized every row, so each one plans every shard's micro-batches on the host and all of them agree
on the count without a collective: FSDP runs collectives inside every forward, so every rank must run the same
number of micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from verlx.workers.micro_batching import balanced_partition


@dataclass(frozen=True)
class SFTLayout:
    """This process's place: data-parallel shard `dp_rank` of `dp_size`, rank `sp_rank` of its Ulysses group."""

    rank: int
    world_size: int
    sp_size: int = 1

    @property
    def dp_size(self) -> int:
        return self.world_size // self.sp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.sp_size

    @property
    def sp_rank(self) -> int:
        return self.rank % self.sp_size

    def shard(self, global_batch: np.ndarray, dp_rank: int | None = None) -> np.ndarray:
        """The rows of `global_batch` that data-parallel shard `dp_rank` (this one's by default) trains on."""
        per_shard = len(global_batch) // self.dp_size
        i = self.dp_rank if dp_rank is None else dp_rank
        return global_batch[i * per_shard : (i + 1) * per_shard]


def _fits(lengths: list[int], k: int, budget: int) -> bool:
    return all(sum(lengths[i] for i in g) <= budget for g in balanced_partition(lengths, k))


def plan_micro_batches(global_batch: np.ndarray, lengths: np.ndarray, layout: SFTLayout, micro_batch_size: int,
                       token_budget: int | None = None) -> list[np.ndarray]:
    """This shard's micro-batches (row indices): `micro_batch_size` rows each, or, with a `token_budget` (tokens of
    one micro-batch of the shard), the same number of balanced groups on every shard, as few as fit the budget on
    the fullest shard."""
    mine = layout.shard(global_batch)
    if token_budget is None:
        return [mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]
    longest = int(lengths[global_batch].max())
    if longest > token_budget:
        raise ValueError(f"data.max_token_len_per_gpu gives micro-batches of {token_budget} tokens, fewer than the "
                         f"longest row ({longest} tokens); raise it to at least {longest} (divided by "
                         f"model.ulysses_sequence_parallel_size={layout.sp_size})")
    shards = [lengths[layout.shard(global_batch, d)].tolist() for d in range(layout.dp_size)]
    count = max(1, max(-(-sum(s) // token_budget) for s in shards))
    while count < len(mine) and not all(_fits(s, count, token_budget) for s in shards):
        count += 1
    return [mine[np.array(g)] for g in balanced_partition(lengths[mine].tolist(), count)]
