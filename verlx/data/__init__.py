"""Prompt data: parquet datasets (veRL schema), a resumable sampler and the batch loader."""

from verlx.data.loader import PromptDataLoader, build_dataloaders, build_train_dataloader, build_val_dataloader
from verlx.data.parquet import read_parquet_columns, write_parquet_atomic
from verlx.data.rl_dataset import PROMPT_TRUNCATIONS, RLHFDataset
from verlx.data.sampler import StatefulSampler

__all__ = [
    "PROMPT_TRUNCATIONS",
    "PromptDataLoader",
    "RLHFDataset",
    "StatefulSampler",
    "build_dataloaders",
    "build_train_dataloader",
    "build_val_dataloader",
    "read_parquet_columns",
    "write_parquet_atomic",
]
