"""Objectives on log pi itself (REINFORCE-style, no ratio in the gradient path): CISPO, GPG and DRO."""

from __future__ import annotations

import torch

from verlx.algorithms.core import agg_loss
from verlx.algorithms.policy_losses.base import POLICY_LOSSES, bounded_ratio, fraction, loss_metrics


@POLICY_LOSSES.register("cispo")
def cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """CISPO (MiniMax 2025): REINFORCE weighted by the clipped, stop-gradient ratio,
    loss = -sg(clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * log pi. No token loses its gradient;
    pg_clipfrac counts tokens whose weight was clipped."""
    log_ratio, ratio = bounded_ratio(old_log_prob, log_prob)
    weight = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high).detach()
    losses = -weight * advantages * log_prob
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(log_ratio, response_mask, clipfrac=fraction(ratio != weight, response_mask))


@POLICY_LOSSES.register("gpg")
def gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """GPG (Chu et al. 2025): plain policy gradient -A * log pi, no ratio and no clipping."""
    pg_loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(log_prob - old_log_prob, response_mask)


@POLICY_LOSSES.register("dro")
def dro(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """DRO (Richemond et al. 2024): policy gradient with a quadratic penalty on the log ratio,
    loss = -(A * log pi - beta/2 * (log pi - log pi_old)^2), beta = actor.policy_loss.dro_beta (required, > 0).
    Nothing is clipped: pg_clipfrac is 0."""
    beta = config.policy_loss.dro_beta
    if beta is None or not beta > 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.dro_beta={beta} must be a positive number when "
                         "policy_loss.loss_mode=dro (the weight of DRO's quadratic log-ratio penalty)")
    log_ratio = log_prob - old_log_prob
    losses = -(advantages * log_prob - 0.5 * beta * log_ratio.square())
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(log_ratio, response_mask)
