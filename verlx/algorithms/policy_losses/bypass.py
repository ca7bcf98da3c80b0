"""veRL's rollout-correction bypass mode (algorithm.rollout_correction.bypass_mode=true).

The trainer does not recompute old log-probs: old_log_probs are the rollout engine's, so the policy loss compares
the current policy with π_rollout directly. In every micro-batch the configured IS weights and rejection mask
(algorithms/rollout_correction.py) are computed between the current, detached log-probs and π_rollout; rejected
tokens leave the loss, and the loss is algorithm.rollout_correction.loss_type:
  ppo_clip   vanilla PPO with ratio π/π_rollout; the IS weights are not applied (the clipped ratio already is one)
  reinforce  -w A log π with w the truncated IS weight (1 when rollout_is is null), no clipping
The correction's metrics are returned as rollout_corr/<name>, averaged over the update's micro-batches. This
replaces actor.policy_loss.loss_mode, as in veRL.
"""

from __future__ import annotations

import functools

from verlx.algorithms.core import agg_loss
from verlx.algorithms.policy_losses.base import POLICY_LOSSES, PolicyLossFn, loss_metrics
from verlx.algorithms.policy_losses.ppo import vanilla
from verlx.algorithms.rollout_correction import BYPASS_LOSS_TYPES, KEY, correction_tensors


def ppo_clip(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, is_weights, **agg_kwargs):
    return vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs)


def reinforce(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, is_weights, **agg_kwargs):
    losses = -advantages * log_prob
    if is_weights is not None:
        losses = losses * is_weights
    pg_loss = agg_loss(losses, response_mask, loss_agg_mode, **agg_kwargs)
    return pg_loss, loss_metrics(log_prob - old_log_prob, response_mask)


@POLICY_LOSSES.register("bypass_mode")
def bypass_mode(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, correction=None,
                **agg_kwargs):
    """The bypass-mode loss; `correction` is the RolloutCorrectionConfig (select_policy_loss binds it)."""
    if correction is None or not correction.bypass_mode:
        raise ValueError(f"actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode is the loss that {KEY}"
                         f".bypass_mode=true selects; set {KEY}.bypass_mode=true (and {KEY}.loss_type) instead")
    agg_kwargs.pop("weights", None)  # the trainer computes no decoupled IS weights in bypass mode
    is_weights, keep, metrics = correction_tensors(log_prob.detach(), old_log_prob, response_mask, correction)
    mask = response_mask if keep is None else response_mask * keep.to(response_mask.dtype)
    loss_fn = BYPASS_LOSS_TYPES.get(correction.loss_type)
    pg_loss, out = loss_fn(old_log_prob, log_prob, advantages, mask, loss_agg_mode, config, is_weights, **agg_kwargs)
    out.update({f"rollout_corr/{name}": value.detach() for name, value in metrics.items()})
    return pg_loss, out


def select_policy_loss(actor_config, rollout_correction=None) -> PolicyLossFn:
    """The actor's policy loss: bypass mode's when algorithm.rollout_correction.bypass_mode is on, else
    actor.policy_loss.loss_mode's."""
    if rollout_correction is not None and rollout_correction.bypass_mode:
        return functools.partial(bypass_mode, correction=rollout_correction)
    return POLICY_LOSSES.get(actor_config.policy_loss.loss_mode)
