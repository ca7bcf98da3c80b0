"""Learning-rate schedules as multipliers of the peak lr: linear warmup, then a named decay (registry)."""

from __future__ import annotations

import math
from collections.abc import Callable

from verlx.utils.registry import Registry

# name → decay(progress in [0, 1], min_lr_ratio) → multiplier
LR_SCHEDULES: Registry[Callable[[float, float], float]] = Registry("lr schedule", config_key="optim.lr_scheduler")


@LR_SCHEDULES.register("constant")
def _constant(progress: float, min_lr_ratio: float) -> float:
    return 1.0


@LR_SCHEDULES.register("cosine")
def _cosine(progress: float, min_lr_ratio: float) -> float:
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_multiplier(name: str, total_steps: int, warmup_steps: int, min_lr_ratio: float = 0.0) -> Callable[[int], float]:
    """step → lr multiplier for torch.optim.lr_scheduler.LambdaLR (step counts optimizer steps taken)."""
    decay = LR_SCHEDULES.get(name)
    decay_steps = max(1, total_steps - warmup_steps)

    def multiplier(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        return decay(min(1.0, (step - warmup_steps) / decay_steps), min_lr_ratio)

    return multiplier
