"""The optimal token baseline (OTB; "Optimal Token Baseline", arXiv 2602.07078): a baseline per token position,
not per response, registered as algorithm.adv_estimator=optimal_token_baseline and tir_optimal_token_baseline.

Within a group (the responses to one prompt), at token position t:
  G_t  = sum_{k >= t} r_k                          reward-to-go (undiscounted; tokens outside the mask carry 0)
  w_j  = 1 - 2 pi_j + sum_v pi_v^2                  ||e_{y_j} - pi_j||^2, the squared logit gradient of token j
                                                    (pi_j from old_log_probs; times rho_j^2 with rollout IS weights)
  W_t  = sum_{j <= t} w_j                           accumulated over the response's valid tokens
  B_t  = sum_i G_t W_t / (sum_i W_t + 1e-8)          over the group's responses valid at t
  A_t  = G_t - B_t
Where the group's single longest response runs past the second longest, its baseline is 0 there (A = G: nothing
to compare with), and a group of one response gets A = G; both as veRL 0.9.1 does (a difference from verlx's
other group estimators, which give 0 to a group of one: here the per-token rule already says "no peer, no
baseline"). `optimal_token_baseline` aligns responses by position in the response tensor; the tool-integrated
(multi-turn) `tir_optimal_token_baseline` aligns them by the index among their valid tokens, so tool output inside a
response does not shift the comparison. (veRL's tir variant leaves responses without valid tokens out of the group;
that never changes a result: such a response adds nothing to B, and a group of one plus empty responses is
exactly the lone-tail case.)
Returns are G_t on valid tokens, 0 elsewhere (veRL leaves G_t at masked positions; no critic reads them).
"""

from __future__ import annotations

import torch

from verlx.algorithms.advantages import AdvantageEstimator
from verlx.algorithms.groups import group_best_and_runner_up, group_ids
from verlx.algorithms.returns import pack_valid_left, unpack

EPSILON = 1e-8


def _group_sum(values: torch.Tensor, ids: torch.Tensor, num_groups: int) -> torch.Tensor:
    return torch.zeros((num_groups, *values.shape[1:]), dtype=values.dtype,
                       device=values.device).index_add_(0, ids, values)


def _baseline(returns, weights, mask, ids, num_groups) -> torch.Tensor:
    """B_t per response [B, R] (rows aligned the way the caller wants), 0 for groups of one response and on the
    lone tail of a group's unique longest response."""
    numerator = _group_sum(returns * weights * mask, ids, num_groups)
    denominator = _group_sum(weights * mask, ids, num_groups)
    baseline = numerator[ids] / (denominator[ids] + EPSILON)
    count = _group_sum(torch.ones_like(returns[:, 0]), ids, num_groups)[ids]
    longest, best, runner_up = group_best_and_runner_up(mask.sum(-1), ids, num_groups)
    positions = torch.arange(returns.shape[-1], device=returns.device)[None, :]
    lone_tail = (longest & (best > runner_up))[:, None] & (positions >= runner_up[:, None])
    keep = (count >= 2)[:, None] & ~lone_tail
    return torch.where(keep, baseline, torch.zeros_like(baseline))


def _token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                    rollout_is_weights, by_valid_index: bool):
    mask = response_mask.to(token_level_rewards.dtype)
    returns = (token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1)
    per_token = 1 - 2 * torch.exp(old_log_probs.to(mask.dtype)) + sum_pi_squared.to(mask.dtype)
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights.to(mask.dtype).square()
    cumulative = (per_token * mask).cumsum(-1)
    ids, num_groups = group_ids(index, returns.device)
    if ids.shape[0] != returns.shape[0]:
        raise ValueError(f"group index has {ids.shape[0]} entries for {returns.shape[0]} samples")
    if not by_valid_index:
        baseline = _baseline(returns, cumulative, mask, ids, num_groups)
        return (returns - baseline) * mask, returns * mask
    order = pack_valid_left(response_mask)
    packed_mask = mask.gather(-1, order)
    packed_returns = returns.gather(-1, order) * packed_mask
    baseline = _baseline(packed_returns, cumulative.gather(-1, order) * packed_mask, packed_mask, ids, num_groups)
    return unpack((packed_returns - baseline) * packed_mask, order), returns * mask


def optimal_token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                           rollout_is_weights=None):
    """OTB with responses aligned by position (single-turn); see the module docstring."""
    return _token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                           rollout_is_weights, by_valid_index=False)


def tir_optimal_token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                               rollout_is_weights=None):
    """OTB with responses aligned by valid-token index (multi-turn, tool output masked out)."""
    return _token_baseline(token_level_rewards, response_mask, index, old_log_probs, sum_pi_squared,
                           rollout_is_weights, by_valid_index=True)


OPTIMAL_TOKEN_BASELINE = AdvantageEstimator("optimal_token_baseline", torch.no_grad()(optimal_token_baseline),
                                            needs_groups=True, needs_sum_pi_squared=True)
TIR_OPTIMAL_TOKEN_BASELINE = AdvantageEstimator("tir_optimal_token_baseline",
                                                torch.no_grad()(tir_optimal_token_baseline),
                                                needs_groups=True, needs_sum_pi_squared=True)
