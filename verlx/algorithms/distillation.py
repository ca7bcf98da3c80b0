"""On-policy distillation (veRL's distillation.distillation_loss): the student is trained towards the teacher on
the tokens it sampled itself. Per token the loss is a KL estimate with the student as the policy and the teacher as
the reference (the estimator modes, kl_penalty(student, teacher, loss_mode): k1 = log s - log t, k3 = t/s -
log(t/s) - 1, ...), or with forward_kl_topk the forward KL over the teacher's k likeliest tokens at each position
(verlx.models.topk_distillation), clamped to ±loss_max_clamp when set. It is then either minimised directly
(aggregated like any token loss), or with use_policy_gradient used as a reward: a PPO clipped loss against the old
log-probs with advantage -loss per token (detached), after Thinking Machines' "On-policy distillation" (2025)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from verlx.algorithms.core import agg_loss, masked_mean
from verlx.algorithms.policy_losses import POLICY_LOSSES
from verlx.batch_columns import TEACHER_LOG_PROB, TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS

# veRL's single-sample estimator modes (the teacher's log-prob of the sampled token), and its top-k mode (the
# teacher's top-k log-probs at every position: verlx.models.topk_distillation)
ESTIMATOR_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
TOP_K_MODES = ("forward_kl_topk",)


def uses_teacher_topk(config) -> bool:
    """`config` is the distillation_loss section."""
    return config.loss_mode in TOP_K_MODES


def distillation_inputs(config) -> list[str]:
    """The batch columns the teacher's phase adds and the update reads."""
    return [TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS] if uses_teacher_topk(config) else [TEACHER_LOG_PROB]


@dataclass
class DistillationLoss:
    """One micro-batch's distillation loss (its share of the mini-batch's, like the policy loss), the extremes of
    the per-token losses before clamping (over valid tokens; +inf / -inf when there are none), and token means
    (abs_loss; the PPO loss's clip fractions and ppo_kl with use_policy_gradient), all named distillation/*."""

    loss: torch.Tensor
    loss_min: torch.Tensor
    loss_max: torch.Tensor
    means: dict[str, torch.Tensor] = field(default_factory=dict)


def distillation_loss(config, losses: torch.Tensor, student_log_prob: torch.Tensor, old_log_prob: torch.Tensor,
                      response_mask: torch.Tensor, loss_agg_mode: str, weights: torch.Tensor | None = None,
                      **agg_kwargs) -> DistillationLoss:
    """`config` is the distillation_loss section; `losses` the per-token distillation losses (an estimator's
    kl_penalty(student, teacher, loss_mode), or the top-k forward KL); tensors are [B, R]; agg_kwargs (the counts)
    go to agg_loss, as for the actor's policy loss; rollout-correction `weights` only to the PPO loss of
    use_policy_gradient (as in veRL)."""
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
