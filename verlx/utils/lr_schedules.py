"""Learning-rate schedules as multipliers of the peak lr: linear warmup, then a named decay (registry).

One implementation for every trainer: PPO's actor and critic (both backends) and SFT.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from verlx.utils.registry import Registry

# name → decay(progress in [0, 1], min_lr_ratio, num_cycles) → multiplier
LR_SCHEDULES: Registry[Callable[[float, float, float], float]] = Registry("lr schedule",
                                                                         config_key="optim.lr_scheduler")


@LR_SCHEDULES.register("constant")
def _constant(progress: float, min_lr_ratio: float, num_cycles: float) -> float:
    return 1.0


@LR_SCHEDULES.register("cosine")
def _cosine(progress: float, min_lr_ratio: float, num_cycles: float) -> float:
    """num_cycles=0.5: half a cosine wave, from the peak down to min_lr_ratio."""
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))


def lr_multiplier(name: str, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.0,
                  num_cycles: float = 0.5) -> Callable[[int], float]:
    """step → lr multiplier for torch.optim.lr_scheduler.LambdaLR (step counts optimizer steps taken)."""
    decay = LR_SCHEDULES.get(name)
    decay_steps = max(1, total_steps - warmup_steps)

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return decay(min(1.0, (step - warmup_steps) / decay_steps), min_lr_ratio, num_cycles)

    return multiplier


def optim_lr_multiplier(optim_cfg, total_steps: int) -> Callable[[int], float]:
    """The multiplier of a PPO role's `optim` section (veRL's keys): its total_training_steps when positive, else
    the run's; lr_warmup_steps when >= 0, else lr_warmup_steps_ratio of the total; warmup_style (deprecated) or
    lr_scheduler_type."""
    total = optim_cfg.total_training_steps if optim_cfg.total_training_steps > 0 else total_steps
    warmup = optim_cfg.lr_warmup_steps
    if warmup < 0:
        warmup = int(optim_cfg.lr_warmup_steps_ratio * total)
    return lr_multiplier(optim_cfg.warmup_style or optim_cfg.lr_scheduler_type, total, warmup,
                         optim_cfg.min_lr_ratio, optim_cfg.num_cycles)
