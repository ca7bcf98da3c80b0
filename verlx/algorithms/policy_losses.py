"""Policy losses (actor_rollout_ref.actor.policy_loss.loss_mode).

Each loss is fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs)
-> (pg_loss, metrics): tensors are [B, R] over response tokens, config is the ActorConfig, agg_kwargs
(num_tokens, num_seqs, norm_length, and `weights`: the rollout-correction IS weights when enabled) go to agg_loss,
which multiplies each token's loss by its weight, and metrics holds detached 0-dim tensors pg_clipfrac,
pg_clipfrac_lower and ppo_kl (the mean of old - new log-prob), so the worker can reduce them without a host sync
per micro-batch. ratio = pi / pi_old throughout.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from verlx.algorithms.core import agg_loss, masked_mean
from verlx.utils.registry import Registry

PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss", "actor_rollout_ref.actor.policy_loss.loss_mode")

LOG_RATIO_LIMIT = 20.0  # |log ratio| beyond this is clamped before exp so one stale token cannot overflow


def _metrics(log_ratio, response_mask, clipfrac=None, clipfrac_lower=None) -> dict[str, torch.Tensor]:
    zero = torch.zeros((), dtype=log_ratio.dtype, device=log_ratio.device)
    return {
        "pg_clipfrac": (zero if clipfrac is None else clipfrac).detach(),
        "pg_clipfrac_lower": (zero if clipfrac_lower is None else clipfrac_lower).detach(),
        "ppo_kl": masked_mean(-log_ratio, response_mask).detach(),
    }


def _fraction(condition: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return masked_mean(condition.float(), response_mask)


@POLICY_LOSSES.register("vanilla")
def vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """PPO clip (Schulman et al. 2017) with asymmetric range [1 - clip_ratio_low, 1 + clip_ratio_high] (DAPO
    clip-higher) and dual clip (Ye et al. 2020): for A < 0 the loss is capped at -A * clip_ratio_c.
    pg_clipfrac: tokens where the clipped term is taken; pg_clipfrac_lower: tokens where the dual-clip cap is."""
    if not config.clip_ratio_c > 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c={config.clip_ratio_c} must be > 1 (dual-clip PPO)")
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    ppo_losses = torch.maximum(unclipped, clipped)
    dual_cap = -advantages * config.clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(ppo_losses, dual_cap), ppo_losses)
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, _metrics(
        log_ratio,
        response_mask,
        clipfrac=_fraction(clipped > unclipped, response_mask),
        clipfrac_lower=_fraction((ppo_losses > dual_cap) & negative, response_mask),
    )


@POLICY_LOSSES.register("gspo")
def gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """GSPO (Zheng et al. 2025): one ratio per sequence, s_i = exp(mean_t log(pi/pi_old)), clipped to
    [1 - clip_ratio_low, 1 + clip_ratio_high]. Per token the ratio is written sg[s_i] * pi_t / sg[pi_t], so its value
    is s_i and its gradient is s_i * grad log pi_t: every token of a sequence gets the same weight.
    The loss is always aggregated seq-mean-token-mean, as in the paper (loss_agg_mode is ignored, as in veRL)."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach()[:, None]
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    losses = torch.maximum(unclipped, clipped)
    pg_loss = agg_loss(losses, response_mask, "seq-mean-token-mean", **agg_kwargs)
    return pg_loss, _metrics(log_ratio, response_mask, clipfrac=_fraction(clipped > unclipped, response_mask))


@POLICY_LOSSES.register("cispo")
def cispo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """CISPO (MiniMax 2025): REINFORCE weighted by the clipped, stop-gradient ratio,
    loss = -sg(clip(ratio, 1 - clip_ratio_low, 1 + clip_ratio_high)) * A * log pi. No token loses its gradient;
    pg_clipfrac counts tokens whose weight was clipped."""
    log_ratio = torch.clamp(log_prob - old_log_prob, -LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high).detach()
    losses = -weight * advantages * log_prob
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, _metrics(log_ratio, response_mask, clipfrac=_fraction(ratio != weight, response_mask))


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
    return pg_loss, _metrics(log_ratio, response_mask, clipfrac=_fraction(detached, response_mask))


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
    return pg_loss, _metrics(log_ratio, response_mask, clipfrac=_fraction(penalised, response_mask))


@POLICY_LOSSES.register("gpg")
def gpg(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """GPG (Chu et al. 2025): plain policy gradient -A * log pi, no ratio and no clipping."""
    pg_loss = agg_loss(-advantages * log_prob, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, _metrics(log_prob - old_log_prob, response_mask)
