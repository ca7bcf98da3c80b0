"""Ratio-clipped objectives: PPO (vanilla), GSPO, GMPO (geo_mean) and SAPO's soft gate."""

from __future__ import annotations

import torch

from verlx.algorithms.core import agg_loss, masked_sum
from verlx.algorithms.policy_losses.base import POLICY_LOSSES, bounded_ratio, fraction, loss_metrics


@POLICY_LOSSES.register("vanilla")
def vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """PPO clip (Schulman et al. 2017) with asymmetric range [1 - clip_ratio_low, 1 + clip_ratio_high] (DAPO
    clip-higher) and dual clip (Ye et al. 2020): for A < 0 the loss is capped at -A * clip_ratio_c.
    pg_clipfrac: tokens where the clipped term is taken; pg_clipfrac_lower: tokens where the dual-clip cap is."""
    if not config.clip_ratio_c > 1.0:
        raise ValueError(f"actor_rollout_ref.actor.clip_ratio_c={config.clip_ratio_c} must be > 1 (dual-clip PPO)")
    log_ratio, ratio = bounded_ratio(old_log_prob, log_prob)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    ppo_losses = torch.maximum(unclipped, clipped)
    dual_cap = -advantages * config.clip_ratio_c
    negative = advantages < 0
    losses = torch.where(negative, torch.minimum(ppo_losses, dual_cap), ppo_losses)
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(
        log_ratio,
        response_mask,
        clipfrac=fraction(clipped > unclipped, response_mask),
        clipfrac_lower=fraction((ppo_losses > dual_cap) & negative, response_mask),
    )


@POLICY_LOSSES.register("gspo")
def gspo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """GSPO (Zheng et al. 2025): one ratio per sequence, s_i = exp(mean_t log(pi/pi_old)), clipped to
    [1 - clip_ratio_low, 1 + clip_ratio_high]. Per token the ratio is written sg[s_i] * pi_t / sg[pi_t], so its value
    is s_i and its gradient is s_i * grad log pi_t: every token of a sequence gets the same weight.
    The loss is aggregated with loss_agg_mode like any other (the paper's choice is seq-mean-token-mean; veRL 0.9.1
    also honours the configured mode)."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)
    token_log_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach()[:, None]
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - config.clip_low, 1 + config.clip_high)
    losses = torch.maximum(unclipped, clipped)
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(log_ratio, response_mask, clipfrac=fraction(clipped > unclipped, response_mask))


@POLICY_LOSSES.register("geo_mean")
def geo_mean(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """GMPO (Zhao et al. 2025): the geometric mean of the token ratios instead of their arithmetic mean. Each token's
    log ratio is clipped PPO-style in log space to [-clip_ratio_low, clip_ratio_high] (only on the side that would
    increase the objective), the sequence ratio is exp(mean_t clipped log ratio), the sequence advantage is the mean
    of its tokens' advantages, and loss_i = -A_i * ratio_i. Sequences are averaged (loss_agg_mode is not used, as in
    veRL); IS weights are reduced to their per-sequence geometric mean.
    Unlike veRL (a plain mean over the micro-batch's rows) the mean is over the mini-batch's sequences that have
    valid tokens (num_seqs), so micro-batching and data parallelism do not change it.
    pg_clipfrac / pg_clipfrac_lower: tokens whose log ratio lies outside the range, with A > 0 / A < 0."""
    mask = response_mask.to(log_prob.dtype)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    bounded = torch.clamp(log_ratio, -config.clip_low, config.clip_high)
    chosen = sign * torch.minimum(sign * log_ratio, sign * bounded)
    lengths = mask.sum(dim=-1)
    seq_ratio = torch.exp(masked_sum(chosen, mask, dim=-1) / lengths.clamp(min=1))
    seq_advantage = masked_sum(advantages, mask, dim=-1) / lengths.clamp(min=1)
    seq_losses = -seq_advantage * seq_ratio
    weights = agg_kwargs.get("weights")
    if weights is not None:
        log_weights = masked_sum(torch.log(weights.to(log_prob.dtype) + 1e-10), mask, dim=-1)
        seq_losses = seq_losses * torch.exp(log_weights / lengths.clamp(min=1))
    pg_loss = agg_loss(seq_losses[:, None], (lengths > 0)[:, None], "seq-mean-token-sum",
                       num_seqs=agg_kwargs.get("num_seqs"))
    outside = log_ratio != bounded
    return pg_loss, loss_metrics(log_ratio, response_mask, clipfrac=fraction(outside & (advantages > 0), mask),
                                 clipfrac_lower=fraction(outside & (advantages < 0), mask))


@POLICY_LOSSES.register("sapo")
def sapo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """SAPO (Gao et al. 2025): a smooth gate instead of a hard clip, loss = -A * f(r) with
    f(r) = sigmoid(tau (r - 1)) * 4 / tau, tau = actor.tau_pos for A > 0 and actor.tau_neg otherwise; f(1) = 2/tau
    and f'(1) = 1, so on-policy it is the policy gradient, and the gradient fades smoothly as r leaves 1.
    Always aggregated seq-mean-token-mean (loss_agg_mode is not used, as in veRL). No token is clipped:
    pg_clipfrac is 0."""
    if not (config.tau_pos > 0 and config.tau_neg > 0):
        raise ValueError(f"actor_rollout_ref.actor.tau_pos={config.tau_pos} and tau_neg={config.tau_neg} must be > 0 "
                         "(SAPO's gate temperatures; the paper uses 1.0 and 1.05)")
    log_ratio, ratio = bounded_ratio(old_log_prob, log_prob)
    tau = torch.where(advantages > 0, torch.as_tensor(config.tau_pos, dtype=ratio.dtype, device=ratio.device),
                      torch.as_tensor(config.tau_neg, dtype=ratio.dtype, device=ratio.device))
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_loss = agg_loss(-gates * advantages, response_mask, "seq-mean-token-mean", **agg_kwargs)
    return pg_loss, loss_metrics(log_ratio, response_mask)
