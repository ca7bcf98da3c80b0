"""trainer.device → the device to run on: one rule for every entry point."""

from __future__ import annotations

import logging

import torch

logger = logging.getLogger(__name__)


def resolve_device(requested: str, local_rank: int = 0, key: str = "trainer.device",
                   cpu_fallback: str | None = None) -> torch.device:
    """auto: cuda:<local_rank> when a GPU is visible, else the CPU; cpu and cuda as named. cuda without a visible GPU
    is an error naming `key`, unless `cpu_fallback` is given: then a warning ("running on CPU <cpu_fallback>") and
    the CPU (the Ray entry points, whose default is cuda, run their CPU workers so)."""
    cuda = torch.cuda.is_available()
    if requested == "cuda" and not cuda:
        if cpu_fallback is None:
            raise RuntimeError(f"{key}=cuda but no CUDA GPU is visible; use {key}=auto or cpu")
        logger.warning("%s=cuda but no GPU is visible: running on CPU %s", key, cpu_fallback)
        return torch.device("cpu")
    if requested == "cuda" or (requested == "auto" and cuda):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")
