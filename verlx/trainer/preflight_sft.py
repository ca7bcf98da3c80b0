"""Pre-flight checks of an SFT config (sft_trainer.yaml), run on every rank before the model loads."""

from __future__ import annotations

from verlx.config.loader import Findings
from verlx.config.ranges import SFT_RANGES, range_problems
from verlx.config.sft import DEVICES, SFTConfig
from verlx.utils.lr_schedules import LR_SCHEDULES

# the loggers of verlx.utils.tracking (shared with PPO) that the SFT trainer offers
SFT_LOGGERS = ("console", "file")


def validate_sft(cfg: SFTConfig, world_size: int) -> None:
    """Checks across keys, all reported at once, each naming its keys and what would work."""
    from verlx.data.sft_dataset import TRUNCATIONS  # imports torch: not at module level, so config errors stay quick

    f = Findings()
    d, o, t = cfg.data, cfg.optim, cfg.trainer
    f.require(bool(cfg.model.partial_pretrain),
              "model.partial_pretrain is not set: give the model directory, e.g. model.partial_pretrain=~/models/tiny")
    f.choice("data.truncation", d.truncation, TRUNCATIONS)
    f.choice("trainer.device", t.device, DEVICES)
    f.choice("optim.lr_scheduler", o.lr_scheduler, LR_SCHEDULES.names())
    for name in t.loggers:
        f.choice("trainer.logger", name, SFT_LOGGERS)
    for key, value in (
        ("data.train_batch_size", d.train_batch_size),
        ("data.micro_batch_size_per_gpu", d.micro_batch_size_per_gpu),
        ("data.max_length", d.max_length),
        ("data.val_batch_size", d.val_batch_size),
        ("data.val_max_new_tokens", d.val_max_new_tokens),
        ("trainer.log_freq", t.log_freq),
    ):
        f.require(value > 0, f"{key}={value} must be positive")
    f.require(
        d.train_batch_size <= 0 or d.train_batch_size % world_size == 0,
        f"data.train_batch_size={d.train_batch_size} does not split evenly over {world_size} processes; "
        f"use a multiple of {world_size}",
    )
    f.require(t.total_training_steps is not None or t.total_epochs > 0,
              f"trainer.total_epochs={t.total_epochs} must be positive when trainer.total_training_steps is null")
    f.require(t.total_training_steps is None or t.total_training_steps > 0,
              f"trainer.total_training_steps={t.total_training_steps} must be positive (or null to use epochs)")
    f.require(
        t.target_val_accuracy is None or (bool(d.val_files) and t.test_freq > 0),
        f"trainer.target_val_accuracy={t.target_val_accuracy} needs validation during training: set "
        f"data.val_files and trainer.test_freq > 0, or trainer.target_val_accuracy=null",
    )
    f.require(0.0 <= o.lr_warmup_steps_ratio < 1.0,
              f"optim.lr_warmup_steps_ratio={o.lr_warmup_steps_ratio} must be in [0, 1)")
    f.require(len(o.betas) == 2, f"optim.betas={o.betas} must hold two numbers")
    if t.nnodes is not None or t.n_gpus_per_node is not None:
        declared = (t.nnodes or 1) * (t.n_gpus_per_node or 1)
        f.require(
            declared == world_size,
            f"trainer.nnodes × trainer.n_gpus_per_node = {declared} but the launcher started {world_size} "
            f"process(es); match torchrun's --nnodes/--nproc_per_node, or leave both keys null",
        )
    f.problems += range_problems(cfg, SFT_RANGES)
    f.raise_problems()
