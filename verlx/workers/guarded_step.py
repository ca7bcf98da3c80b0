"""Optimizer steps that skip non-finite gradients and stop after too many in a row."""

from __future__ import annotations

import math

import torch

from verlx.metrics.accumulator import MetricAccumulator
from verlx.utils.errors import VerlxError


class NonFiniteUpdates(VerlxError, RuntimeError):
    """Too many consecutive optimizer steps had a non-finite loss or gradient norm."""


class GuardedStepper:
    """Clip, check the global gradient norm (one host sync per optimizer step), step or skip and count."""

    def __init__(self, role: str, max_consecutive_nonfinite: int):
        self.role = role
        self.max_consecutive = max_consecutive_nonfinite
        self.consecutive = 0

    def step(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, grad_clip: float,
             metrics: MetricAccumulator) -> None:
        params = [p for p in module.parameters() if p.requires_grad]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        if hasattr(grad_norm, "full_tensor"):
            grad_norm = grad_norm.full_tensor()
        if math.isfinite(float(grad_norm)):
            optimizer.step()
            self.consecutive = 0
            metrics.add_mean(f"{self.role}/grad_norm", grad_norm.detach().float())
        else:
            optimizer.zero_grad(set_to_none=True)
            self.consecutive += 1
            metrics.add_count(f"{self.role}/nonfinite_updates_skipped")
            if self.consecutive >= self.max_consecutive:
                raise NonFiniteUpdates(
                    f"{self.consecutive} consecutive {self.role} updates had a non-finite loss or gradient norm "
                    f"(last: {float(grad_norm)}); stopping as trainer.max_consecutive_nonfinite_updates says. The "
                    "usual cause is a learning rate far too large (optim.lr of this role)"
                )
        metrics.end_step()
