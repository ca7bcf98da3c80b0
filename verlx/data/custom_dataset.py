"""data.custom_cls: a Dataset class of your own (veRL's keys and constructor).

The class (data.custom_cls.name in the file data.custom_cls.path) is constructed as veRL constructs its datasets:
cls(data_files=<train or val files>, tokenizer=<the actor's>, processor=<a vision-language model's, else None>,
config=<the data section, read-only
OmegaConf>, max_samples=<train/val_max_samples>). It subclasses torch.utils.data.Dataset (as veRL requires) or
verlx's RLHFDataset (whose constructor takes those arguments too and whose batches are used as they are).

Any other dataset's rows (`dataset[i]`, dicts) become prompt batches here: rows that carry input_ids /
attention_mask / position_ids tensors (older veRL datasets, already left-padded) are stacked as they are; rows that
carry only the chat (`raw_prompt`, or data.prompt_key: veRL 0.9.1's datasets, which leave the template to the
rollout) are rendered with the tokenizer's chat template, truncated per data.truncation and left-padded to
data.max_prompt_length. Every other value of a row travels along as a non-tensor column (data_source,
reward_model, extra_info, ...).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from verlx.config.loader import DataError
from verlx.data.rl_dataset import (
    PROMPT_TRUNCATIONS,
    RLHFDataset,
    object_array,
    prompt_pad_token_id,
    render_and_tokenize,
)
from verlx.protocol import DataProto, collate_rows
from verlx.utils.user_code import load_object


def data_view(data_config):
    """The data section as veRL hands it to user classes: a read-only OmegaConf DictConfig (attribute access and
    .get both work)."""
    from omegaconf import OmegaConf

    view = OmegaConf.create(dataclasses.asdict(data_config))
    OmegaConf.set_readonly(view, True)
    return view


def custom_dataset_class(data_config) -> type:
    cls = load_object(data_config.custom_cls.path, data_config.custom_cls.name, "data.custom_cls.path",
                      "data.custom_cls.name")
    if not (isinstance(cls, type) and issubclass(cls, (torch.utils.data.Dataset, RLHFDataset))):
        raise TypeError(f"data.custom_cls.name={data_config.custom_cls.name} ({data_config.custom_cls.path}) must be a "
                        "class subclassing torch.utils.data.Dataset (or verlx.data.RLHFDataset)")
    return cls


def build_dataset(data_config, files, tokenizer, max_samples: int, processor=None):
    """The dataset of `files`: verlx's RLHFDataset, or data.custom_cls (batched by UserDataset unless it is an
    RLHFDataset); `processor`: a vision-language model's, or None."""
    if not data_config.custom_cls.path:
        return RLHFDataset(files, tokenizer, data_config, max_samples, processor=processor)
    cls = custom_dataset_class(data_config)
    dataset = cls(data_files=files, tokenizer=tokenizer, processor=processor, config=data_view(data_config),
                  max_samples=max_samples)
    return dataset if isinstance(dataset, RLHFDataset) else UserDataset(dataset, tokenizer, data_config)


class UserDataset:
    """A user's Dataset behind verlx's loader: `get_batch(indices)` turns its rows into a prompt batch."""

    def __init__(self, dataset, tokenizer, data_config):
        self.dataset = dataset
        self.tokenizer = tokenizer
        self.config = data_config
        self.pad_token_id = prompt_pad_token_id(tokenizer)
        if len(dataset) <= 0:
            raise DataError(f"data.custom_cls.name={data_config.custom_cls.name} yields no rows")

    def __len__(self) -> int:
        return len(self.dataset)

    def column(self, key: str) -> None:
        """Columns are not known without reading every row: the checks that read them skip a user's dataset."""
        return None

    def get_batch(self, indices) -> DataProto:
        rows = [dict(self.dataset[int(i)]) for i in np.asarray(indices).reshape(-1)]
        if all(isinstance(row.get("input_ids"), torch.Tensor) for row in rows):
            return collate_rows(rows)
        prompt_key = "raw_prompt" if "raw_prompt" in rows[0] else self.config.prompt_key
        missing = [i for i, row in zip(indices, rows) if prompt_key not in row]
        if missing:
            raise DataError(f"data.custom_cls.name={self.config.custom_cls.name}: rows {list(missing)[:8]} have "
                            f"neither input_ids tensors nor the chat ('raw_prompt' or '{self.config.prompt_key}')")
        tensors = self._encode([row[prompt_key] for row in rows])
        non_tensor = {k: object_array([row.get(k) for row in rows]) for k in rows[0]
                      if not isinstance(rows[0][k], torch.Tensor)}
        if self.config.return_raw_chat:
            non_tensor["raw_prompt"] = object_array([list(row[prompt_key]) for row in rows])
        return DataProto(tensors, non_tensor)

    def _encode(self, chats: list) -> dict[str, torch.Tensor]:
        """Chat template, truncation (data.truncation) and left padding to data.max_prompt_length."""
        _, ids = render_and_tokenize(self.tokenizer, [list(c) for c in chats],
                                     dict(self.config.apply_chat_template_kwargs or {}))
        width = self.config.max_prompt_length
        too_long = [len(x) for x in ids if len(x) > width]
        if too_long and self.config.truncation == "error":
            raise DataError(f"data.custom_cls.name={self.config.custom_cls.name}: a prompt is {max(too_long)} tokens, "
                            f"longer than data.max_prompt_length={width}; raise it or set data.truncation to left, "
                            "right or middle")
        if too_long:
            ids = [PROMPT_TRUNCATIONS.get(self.config.truncation)(x, width) if len(x) > width else x for x in ids]
        input_ids = torch.full((len(ids), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
        position_ids = torch.zeros((len(ids), width), dtype=torch.long)
        for row, tokens in enumerate(ids):
            n = len(tokens)
            input_ids[row, width - n:] = torch.tensor(tokens, dtype=torch.long)
            attention_mask[row, width - n:] = 1
            position_ids[row, width - n:] = torch.arange(n)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}
