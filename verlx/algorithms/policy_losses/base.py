"""The policy-loss registry and the metrics every loss returns (see the package docstring)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from verlx.algorithms.core import masked_mean
from verlx.utils.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode")

LOG_RATIO_LIMIT = 20.0  # |log ratio| beyond this is clamped before exp so one stale token cannot overflow


def loss_metrics(log_ratio, response_mask, clipfrac=None, clipfrac_lower=None) -> dict[str, torch.Tensor]:
    """pg_clipfrac, pg_clipfrac_lower (0 when not given) and ppo_kl = mean(old - new log-prob), detached."""
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    return {
        "pg_clipfrac": (zero if clipfrac is None else clipfrac).detach(),
        "pg_clipfrac_lower": (zero if clipfrac_lower is None else clipfrac_lower).detach(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).detach(),
    }


def fraction(condition: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Share of the valid tokens where `condition` holds."""
    return masked_mean(condition.float(), response_mask)


def bounded_ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log ratio clamped to ±LOG_RATIO_LIMIT, ratio = pi / pi_old)."""
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    return log_ratio, torch.exp(log_ratio)
