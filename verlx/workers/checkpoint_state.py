"""What every checkpoint backend writes beside its model/optimizer shards: each rank's scheduler and RNG state, and
(rank 0) the HF config and tokenizer that export needs. One format for FSDP and megatron checkpoints.

On resume the optimizer's state (moments, step counts) and the schedule's position come from the checkpoint, while its
hyper-parameters (lr, betas, weight decay, the schedule's shape) come from this run's config: a changed
`optim.lr` takes effect (torch's load_state_dict alone would bring back the saved values).
"""

from __future__ import annotations

import logging
import os

import torch
import torch.distributed as dist
from torch.optim.lr_scheduler import LambdaLR

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
        _resume_schedule(lr_scheduler, extra["lr_scheduler"])
    if "rng" in extra:
        set_rng_state(extra["rng"])


def _resume_schedule(lr_scheduler, saved: dict) -> None:
    """The position in the schedule (steps taken) from the checkpoint; the peak lr from this run's config."""
    if not isinstance(lr_scheduler, LambdaLR):  # megatron's FactorLRScheduler keeps only its step: lr is the config's
        lr_scheduler.load_state_dict(saved)
        return
    lr_scheduler.load_state_dict({**saved, "base_lrs": list(lr_scheduler.base_lrs)})
    step = lr_scheduler.last_epoch
    lrs = [base * factor(step) for base, factor in zip(lr_scheduler.base_lrs, lr_scheduler.lr_lambdas)]
    for group, lr in zip(lr_scheduler.optimizer.param_groups, lrs):
        group["lr"] = lr
    lr_scheduler._last_lr = lrs


def optimizer_settings(optimizer) -> list[dict] | None:
    """The hyper-parameters of each parameter group (lr, betas, weight decay, ...) as this run's config built them;
    taken before a checkpoint is loaded, put back by restore_optimizer_settings after."""
    if optimizer is None:
        return None
    return [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]


def restore_optimizer_settings(optimizer, settings: list[dict] | None) -> None:
    if optimizer is None or settings is None:
        return
    for group, values in zip(optimizer.param_groups, settings):
        group.update(values)


def save_hf_metadata(path: str, hf_config, tokenizer) -> str | None:
    """Rank 0 writes the HF config and tokenizer under <path>/huggingface; returns that directory (None elsewhere)."""
    if _rank() != 0 or hf_config is None:
        return None
    hf_dir = os.path.join(path, HF_SUBDIR)
    hf_config.save_pretrained(hf_dir)
    if tokenizer is not None:
        tokenizer.save_pretrained(hf_dir)
    return hf_dir
