"""data.sampler: a sampler class of your own (veRL's keys and contract), e.g. a curriculum.

The class (data.sampler.class_name in the file or pkg:// module data.sampler.class_path) subclasses
AbstractSampler (a torch Sampler of row indices) and is constructed as cls(data_source=<the training dataset>,
data_config=<the data section, read-only>). An AbstractCurriculumSampler's update(batch) is called after every
training step with the step's batch (its rewards, advantages, the rows' `index`), so it can reorder what comes next:
the loader takes indices from its iterator lazily, a batch at a time. One epoch is one pass over its iterator
(len(sampler) rows, the last partial batch dropped).

Resume: a sampler with state_dict/load_state_dict (torch's Stateful protocol) gets its state back and continues from
it; any other sampler's epoch is replayed from its start and the rows already consumed are skipped (torchdata's
StatefulDataLoader does the same), which gives the same order when the sampler's order is seeded.
"""

from __future__ import annotations

import itertools
from abc import abstractmethod
from collections.abc import Sized

import numpy as np
from torch.distributed.checkpoint.stateful import Stateful
from torch.utils.data import Sampler

from verlx.utils.user_code import load_object


class AbstractSampler(Sampler[int]):
    """A sampler data.sampler may name."""

    @abstractmethod
    def __init__(self, data_source: Sized, data_config):
        pass


class AbstractCurriculumSampler(AbstractSampler):
    """A sampler that learns from each training step."""

    @abstractmethod
    def update(self, batch) -> None:
        pass


def build_user_sampler(data_config, dataset, data_view) -> UserSampler:
    """The data.sampler class of `data_config` built over `dataset` (constructed with `data_view`)."""
    cls = load_object(data_config.sampler.class_path, data_config.sampler.class_name, "data.sampler.class_path",
                      "data.sampler.class_name")
    sampler = cls(data_source=dataset, data_config=data_view)
    if not isinstance(sampler, AbstractSampler):
        raise TypeError(f"data.sampler.class_name={data_config.sampler.class_name} ({data_config.sampler.class_path}) "
                        "must subclass verlx.data.custom_sampler.AbstractSampler or AbstractCurriculumSampler (veRL's "
                        "verl.experimental.dataset.sampler classes, also importable as "
                        "verlx.experimental.dataset.sampler)")
    return UserSampler(sampler)


class UserSampler:
    """The loader's sampler interface (as StatefulSampler: num_rows, epoch, position, take, update, state) over a
    user's sampler."""

    def __init__(self, sampler: AbstractSampler):
        self.sampler = sampler
        self.num_rows = len(sampler)
        if self.num_rows <= 0:
            raise ValueError(f"data.sampler: {type(sampler).__name__} has length {self.num_rows}; it must yield rows")
        self.epoch = 0
        self.position = 0
        self._iterator = None
        self._skip = 0

    def take(self, count: int, epoch_rows: int) -> np.ndarray:
        """The next `count` row indices of this epoch (fewer at its end), drawn from the sampler's iterator."""
        if self.position >= epoch_rows:
            self._next_epoch()
        if self._iterator is None:
            self._iterator = iter(self.sampler)
            for _ in itertools.islice(self._iterator, self._skip):  # a resumed epoch: rows already consumed
                pass
            self._skip = 0
        wanted = min(count, epoch_rows - self.position)
        rows = np.fromiter(itertools.islice(self._iterator, wanted), dtype=np.int64)
        if len(rows) < wanted:
            raise RuntimeError(f"data.sampler: {type(self.sampler).__name__} yielded {self.position + len(rows)} "
                               f"indices in epoch {self.epoch}, fewer than its length {self.num_rows}")
        self.position += len(rows)
        if self.position >= epoch_rows:
            self._next_epoch()
        return rows

    def _next_epoch(self) -> None:
        self.epoch, self.position, self._iterator = self.epoch + 1, 0, None

    def update(self, batch) -> None:
        """After a training step: a curriculum sampler learns from its batch."""
        if isinstance(self.sampler, AbstractCurriculumSampler):
            self.sampler.update(batch=batch)

    def state_dict(self) -> dict:
        own = self.sampler.state_dict() if isinstance(self.sampler, Stateful) else None
        return {"epoch": self.epoch, "position": self.position, "num_rows": self.num_rows, "user_sampler": own}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position, self._iterator = int(state["epoch"]), int(state["position"]), None
        if isinstance(self.sampler, Stateful) and state.get("user_sampler") is not None:
            self.sampler.load_state_dict(state["user_sampler"])
            self._skip = 0
        else:
            self._skip = self.position
