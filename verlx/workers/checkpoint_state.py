"""What every checkpoint backend writes beside its model/optimizer shards: each rank's scheduler and RNG state, and
(rank 0) the HF config and tokenizer that export needs. One format for FSDP and megatron checkpoints."""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist

from verlx.utils.seeding import rng_state, set_rng_state

logger = logging.getLogger(__name__)

HF_SUBDIR = "huggingface"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def save_rank_state(path: str, lr_scheduler) -> None:
    """extra_rank<r>.pt: the learning-rate schedule, this rank's RNG streams and the world size that wrote them."""
    extra = {"lr_scheduler": lr_scheduler.state_dict() if lr_scheduler else None, "rng": rng_state(),
             "world_size": dist.get_world_size() if dist.is_initialized() else 1}
    torch.save(extra, os.path.join(path, f"extra_rank{_rank()}.pt"))


def load_rank_state(path: str, lr_scheduler) -> None:
    """Restore what save_rank_state wrote. From another world size this rank's file may be missing: the schedule is
    the same on every rank (rank 0's is used), the RNG streams cannot be recovered (left fresh)."""
    extra_path = os.path.join(path, f"extra_rank{_rank()}.pt")
    if not os.path.exists(extra_path):
        logger.warning("%s missing (checkpoint from another world size); using rank 0's scheduler state and "
                       "fresh RNG state for this rank", extra_path)
        extra = torch.load(os.path.join(path, "extra_rank0.pt"), weights_only=False)
        extra.pop("rng", None)
    else:
        extra = torch.load(extra_path, weights_only=False)
    if lr_scheduler is not None and extra.get("lr_scheduler") is not None:
        lr_scheduler.load_state_dict(extra["lr_scheduler"])
    if "rng" in extra:
        set_rng_state(extra["rng"])


def save_hf_metadata(path: str, hf_config, tokenizer) -> str | None:
    """Rank 0 writes the HF config and tokenizer under <path>/huggingface; returns that directory (None elsewhere)."""
    if _rank() != 0 or hf_config is None:
        return None
    hf_dir = os.path.join(path, HF_SUBDIR)
    hf_config.save_pretrained(hf_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(hf_dir)
    return hf_dir
