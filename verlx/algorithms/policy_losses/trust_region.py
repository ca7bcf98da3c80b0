"""DPPO (Rethinking the Trust Region in LLM RL, 2026): the trust region is a divergence between the old and new
probability of the sampled token, not a band around the ratio.

Both losses are -A * sg[min(r, clip_ratio_c)] * log pi * valid: the truncated ratio is a constant weight (TIS,
truncated at actor.clip_ratio_c), and a token leaves the update (valid = 0, detached) when it already moved past
the divergence bound in the direction its advantage pushes. actor.clip_ratio_low / clip_ratio_high (default
actor.clip_ratio) are those bounds, for A <= 0 / A > 0.
pg_clipfrac: tokens outside the trust region; pg_clipfrac_lower: valid tokens whose ratio was truncated.
"""

from __future__ import annotations

import torch

from verlx.algorithms.core import agg_loss
from verlx.algorithms.policy_losses.base import POLICY_LOSSES, bounded_ratio, fraction, loss_metrics


def _trust_region_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, valid, agg_kwargs):
    log_ratio, ratio = bounded_ratio(old_log_prob, log_prob)
    truncated = torch.clamp(ratio, max=config.clip_ratio_c).detach()
    valid = valid.detach().to(log_prob.dtype)
    pg_loss = agg_loss(-advantages * truncated * log_prob * valid, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(log_ratio, response_mask, clipfrac=fraction(valid == 0, response_mask),
                                 clipfrac_lower=fraction((ratio > config.clip_ratio_c) & (valid > 0), response_mask))


@POLICY_LOSSES.register("dppo_tv")
def dppo_tv(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """DPPO-Binary-TV: the divergence is the probability change p - p_old of the sampled token; with A > 0 a token
    stays while p - p_old <= clip_ratio_high, otherwise while p - p_old >= -clip_ratio_low."""
    change = torch.exp(log_prob) - torch.exp(old_log_prob)
    valid = torch.where(advantages > 0, change <= config.clip_high, change >= -config.clip_low)
    return _trust_region_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, valid,
                              agg_kwargs)


@POLICY_LOSSES.register("dppo_kl")
def dppo_kl(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """DPPO-Binary-KL: the divergence is the KL between the Bernoulli distributions (sampled token or not) of the
    old and new policy, p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p)) (1e-8 added inside the last
    log). A token stays while that KL is within the bound, or when it moved against its advantage's push
    (p <= p_old for A > 0, p >= p_old otherwise)."""
    prob, old_prob = torch.exp(log_prob), torch.exp(old_log_prob)
    binary_kl = old_prob * (old_log_prob - log_prob) + (1 - old_prob) * torch.log(
        (1.0 - old_prob + 1e-8) / (1.0 - prob + 1e-8))
    valid = torch.where(advantages > 0, (binary_kl <= config.clip_high) | (prob <= old_prob),
                        (binary_kl <= config.clip_low) | (prob >= old_prob))
    return _trust_region_loss(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, valid,
                              agg_kwargs)
