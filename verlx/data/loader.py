"""PromptDataLoader: DataProto batches of an RLHFDataset (or a data.custom_cls dataset) in a StatefulSampler's order
(or a data.sampler's).

`for batch in loader` runs the rest of the current epoch (all of it, on a fresh loader); the trainer loops over
epochs. The state (the sampler's) can be saved after any batch and restored to continue with the next one.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

from verlx.config.loader import DataError
from verlx.data.custom_dataset import build_dataset, data_view
from verlx.data.custom_sampler import build_user_sampler
from verlx.data.rl_dataset import RLHFDataset
from verlx.data.sampler import StatefulSampler
from verlx.protocol import DataProto, collate_rows


class PromptDataLoader:
    def __init__(self, dataset, batch_size: int, sampler: StatefulSampler, drop_last: bool = True,
                 batch_key: str = "data.train_batch_size"):
        """An epoch is one pass of the sampler: sampler.num_rows rows (a data.sampler may have another length than
        the dataset); `batch_key` names batch_size in errors."""
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        if drop_last and sampler.num_rows < batch_size:
            rows = (f"the dataset has {len(dataset)} rows" if sampler.num_rows == len(dataset) else
                    f"an epoch of the sampler has {sampler.num_rows} rows (the dataset {len(dataset)})")
            raise DataError(f"{rows}, fewer than one batch of {batch_size} ({batch_key}): use more data or a smaller "
                            "batch")
        self.dataset = dataset
        self.batch_size = int(batch_size)
        self.sampler = sampler
        self.drop_last = drop_last

    @property
    def epoch_rows(self) -> int:
        """Rows handed out per epoch (the last partial batch is dropped with drop_last)."""
        n = self.sampler.num_rows
        return n - n % self.batch_size if self.drop_last else n

    def __len__(self) -> int:
        n = self.sampler.num_rows
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def __iter__(self) -> Iterator[DataProto]:
        if self.sampler.position >= self.epoch_rows:  # a state saved with a larger batch size
            self.sampler.epoch, self.sampler.position = self.sampler.epoch + 1, 0
        epoch = self.sampler.epoch
        while self.sampler.epoch == epoch:
            yield self._collate(self.sampler.take(self.batch_size, self.epoch_rows))

    def _collate(self, rows) -> DataProto:
        if hasattr(self.dataset, "get_batch"):
            return self.dataset.get_batch(rows)
        return collate_rows(self.dataset[int(i)] for i in rows)

    def after_step(self, batch: DataProto) -> None:
        """A training step consumed `batch`: a curriculum sampler (data.sampler) learns from it."""
        self.sampler.update(batch)

    def state_dict(self) -> dict:
        return {"sampler": self.sampler.state_dict(), "batch_size": self.batch_size}

    def load_state_dict(self, state: dict) -> None:
        self.sampler.load_state_dict(state["sampler"])


def build_train_dataloader(dataset: RLHFDataset, batch_size: int, shuffle: bool, seed: int) -> PromptDataLoader:
    """Training batches: shuffled per epoch (data.shuffle, data.seed or trainer.seed), last partial batch dropped."""
    return PromptDataLoader(dataset, batch_size, StatefulSampler(len(dataset), shuffle, seed), drop_last=True)


def build_val_dataloader(dataset: RLHFDataset, batch_size: int | None, shuffle: bool = False, seed: int = 0):
    """Validation batches: every row once, file order (data.validation_shuffle), batch_size None = one batch."""
    size = len(dataset) if not batch_size or batch_size <= 0 else batch_size
    return PromptDataLoader(dataset, size, StatefulSampler(len(dataset), shuffle, seed), drop_last=False)


def build_dataloaders(config, tokenizer, processor=None) -> tuple[PromptDataLoader, PromptDataLoader | None]:
    """Training and validation loaders of a PPOConfig (validation None when data.val_files is null). Training
    batches are data.gen_batch_size prompts (null: train_batch_size), in data.sampler's order when one is named.
    `processor`: a vision-language model's (data/vision_prompts.py), None for a text model."""
    data = config.data
    seed = data.seed if data.seed is not None else config.trainer.seed
    train = build_dataset(data, data.train_files, tokenizer, data.train_max_samples, processor)
    batch_size, batch_key = ((data.gen_batch_size, "data.gen_batch_size") if data.gen_batch_size is not None
                             else (data.train_batch_size, "data.train_batch_size"))
    sampler = (build_user_sampler(data, train, data_view(data)) if data.sampler.class_path
               else StatefulSampler(len(train), data.shuffle, seed))
    train_loader = PromptDataLoader(train, batch_size, sampler, drop_last=True, batch_key=batch_key)
    if data.val_files is None:
        return train_loader, None
    val = build_dataset(data, data.val_files, tokenizer, data.val_max_samples, processor)
    return train_loader, build_val_dataloader(val, data.val_batch_size, data.validation_shuffle, seed)
