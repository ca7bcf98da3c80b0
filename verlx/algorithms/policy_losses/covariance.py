"""Clip-Cov and KL-Cov (Cui et al. 2025): PPO variants that act on the tokens whose update moves the policy's
entropy most, measured by the covariance of advantage and log-probability."""

from __future__ import annotations

import torch

from verlx.algorithms.core import agg_loss, masked_mean
from verlx.algorithms.policy_losses.base import POLICY_LOSSES, fraction, loss_metrics


def _token_covariance(advantages, log_prob, response_mask) -> torch.Tensor:
    """(A - mean A)(log pi - mean log pi) per token, means over the valid tokens: how much a token's update moves
    the policy's entropy (Cui et al. 2025). Detached: it only selects tokens."""
    adv, logp = advantages.detach(), log_prob.detach()
    return (adv - masked_mean(adv, response_mask)) * (logp - masked_mean(logp, response_mask))


def _select_by_rank(keys: torch.Tensor, eligible: torch.Tensor, how_many: torch.Tensor) -> torch.Tensor:
    """Mask of the `how_many` eligible entries with the largest keys (how_many may be a tensor: no host sync)."""
    flat = torch.where(eligible, keys, torch.full_like(keys, -torch.inf)).reshape(-1)
    order = torch.argsort(flat, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    return (rank.view_as(keys) < how_many) & eligible


@POLICY_LOSSES.register("clip_cov")
def clip_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """Clip-Cov (Cui et al. 2025): PPO clip, plus a random clip_cov_ratio fraction of the valid tokens (at least one)
    whose covariance lies in (clip_cov_lb, clip_cov_ub) and which PPO did not clip lose their gradient.
    pg_clipfrac counts those tokens."""
    pl = config.policy_loss
    if not pl.clip_cov_ratio > 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.clip_cov_ratio={pl.clip_cov_ratio} must be > 0")
    valid = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    cov = _token_covariance(advantages, log_prob, response_mask)
    eligible = valid & ~(clipped > unclipped) & (cov > pl.clip_cov_lb) & (cov < pl.clip_cov_ub)
    how_many = torch.clamp((pl.clip_cov_ratio * valid.sum()).floor(), min=1)
    detached = _select_by_rank(torch.rand_like(cov), eligible, how_many)
    losses = torch.maximum(unclipped, clipped) * (~detached).to(log_prob.dtype)
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(log_ratio, response_mask, clipfrac=fraction(detached, response_mask))


@POLICY_LOSSES.register("kl_cov")
def kl_cov(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """KL-Cov (Cui et al. 2025): unclipped policy gradient -A * ratio; the kl_cov_ratio fraction of valid tokens
    (at least one) with the largest covariance also pay ppo_kl_coef * |log ratio|. pg_clipfrac counts those tokens."""
    pl = config.policy_loss
    if not pl.kl_cov_ratio > 0:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.kl_cov_ratio={pl.kl_cov_ratio} must be > 0")
    valid = response_mask.bool()
    log_ratio = log_prob - old_log_prob
    losses = -advantages * torch.exp(log_ratio)
    how_many = torch.clamp((pl.kl_cov_ratio * valid.sum()).floor(), min=1)
    penalised = _select_by_rank(_token_covariance(advantages, log_prob, response_mask), valid, how_many)
    losses = losses + pl.ppo_kl_coef * log_ratio.abs() * penalised.to(log_prob.dtype)
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(log_ratio, response_mask, clipfrac=fraction(penalised, response_mask))
