"""StatefulSampler: the order of rows, epoch by epoch, resumable at the exact next batch.

Epoch e visits the rows in a permutation seeded by seed + e (or in file order without shuffling). The state is
(epoch, position): how many rows of epoch e were handed out. A batch that ends an epoch moves the state to
(e + 1, 0) as it is taken, so a checkpoint written after the last batch of an epoch resumes with the next epoch.
"""

from __future__ import annotations

import logging

import numpy as np

logger = logging.getLogger(__name__)


class StatefulSampler:
    def __init__(self, num_rows: int, shuffle: bool = True, seed: int = 0):
        if num_rows <= 0:
            raise ValueError(f"StatefulSampler needs at least one row, got num_rows={num_rows}")
        self.num_rows = int(num_rows)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self.epoch = 0
        self.position = 0
        self._cached: tuple[int, np.ndarray] | None = None

    def order(self, epoch: int) -> np.ndarray:
        """Row indices of one epoch, in visiting order."""
        if self._cached is None or self._cached[0] != epoch:
            if self.shuffle:
                rows = np.random.Generator(np.random.PCG64(self.seed + epoch)).permutation(self.num_rows)
            else:
                rows = np.arange(self.num_rows)
            self._cached = (epoch, rows)
        return self._cached[1]

    def take(self, count: int, epoch_rows: int) -> np.ndarray:
        """The next `count` rows of this epoch (fewer at its end); `epoch_rows` is where the epoch ends
        (num_rows, or less when the last partial batch is dropped)."""
        if self.position >= epoch_rows:
            self.epoch, self.position = self.epoch + 1, 0
        rows = self.order(self.epoch)[self.position : min(self.position + count, epoch_rows)]
        self.position += len(rows)
        if self.position >= epoch_rows:
            self.epoch, self.position = self.epoch + 1, 0
        return rows

    def update(self, batch) -> None:
        """A training step consumed `batch`: this order does not depend on it."""

    def state_dict(self) -> dict:
        return {
            "epoch": self.epoch,
            "position": self.position,
            "num_rows": self.num_rows,
            "shuffle": self.shuffle,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict) -> None:
        if state.get("num_rows", self.num_rows) != self.num_rows or state.get("seed", self.seed) != self.seed:
            logger.warning(
                "resuming the data order of %s rows (seed %s) over %s rows (seed %s): the order differs from the "
                "original run from here on",
                state.get("num_rows"),
                state.get("seed"),
                self.num_rows,
                self.seed,
            )
        self.epoch = int(state["epoch"])
        self.position = min(int(state["position"]), self.num_rows)
