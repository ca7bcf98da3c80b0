"""On-policy distillation (veRL's distillation.distillation_loss, estimator modes): the student is trained towards
the teacher on the tokens it sampled itself. Per token the loss is a KL estimate with the student as the policy and
the teacher as the reference (kl_penalty(student, teacher, loss_mode): k1 = log s - log t, k3 = t/s - log(t/s) - 1,
...), clamped to ±loss_max_clamp when set. It is then either minimised directly (aggregated like any token loss), or
with use_policy_gradient used as a reward: a PPO clipped loss against the old log-probs with advantage -loss per
token (detached), after Thinking Machines' "On-policy distillation" (2025)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from verlx.algorithms.core import agg_loss, masked_mean
from verlx.algorithms.kl import kl_penalty
from verlx.algorithms.policy_losses import POLICY_LOSSES

# veRL's single-sample estimator modes; its top-k mode (forward_kl_topk) needs the teacher's top-k log-probs
ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


@dataclass
class DistillationLoss:
    """One micro-batch's distillation loss (its share of the mini-batch's, like the policy loss), the extremes of
    the per-token losses before clamping (over valid tokens; +inf / -inf when there are none), and token means
    (abs_loss; the PPO loss's clip fractions and ppo_kl with use_policy_gradient), all named distillation/*."""

    loss: torch.Tensor
    loss_min: torch.Tensor
    loss_max: torch.Tensor
    means: dict[str, torch.Tensor] = field(default_factory=dict)


def distillation_loss(config, student_log_prob: torch.Tensor, teacher_log_prob: torch.Tensor,
                      old_log_prob: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str,
                      weights: torch.Tensor | None = None, **agg_kwargs) -> DistillationLoss:
    """`config` is the distillation_loss section; tensors are [B, R]; agg_kwargs (the counts) go to agg_loss, as
    for the actor's policy loss; rollout-correction `weights` only to the PPO loss of use_policy_gradient (as in
    veRL)."""
    losses = kl_penalty(student_log_prob, teacher_log_prob, config.loss_mode)
    valid = response_mask.bool()
    inf = torch.full_like(losses, float("inf"))
    loss_min = torch.where(valid, losses, inf).min().detach()
    loss_max = torch.where(valid, losses, -inf).max().detach()
    means = {"distillation/abs_loss": masked_mean(losses.abs(), response_mask).detach()}
    if config.loss_max_clamp is not None:  # both sides: k1 can be negative
        losses = losses.clamp(min=-config.loss_max_clamp, max=config.loss_max_clamp)
    if config.use_policy_gradient:
        policy_loss = POLICY_LOSSES.get(config.policy_loss_mode)
        loss, pg_metrics = policy_loss(old_log_prob, student_log_prob, -losses.detach(), response_mask,
                                       loss_agg_mode, config, weights=weights,
                                       **agg_kwargs)
        means.update({f"distillation/{name}": value.detach() for name, value in pg_metrics.items()})
    else:
        loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return DistillationLoss(loss, loss_min, loss_max, means)
