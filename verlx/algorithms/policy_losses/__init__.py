"""Policy losses (actor_rollout_ref.actor.policy_loss.loss_mode).

Each loss is fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs)
-> (pg_loss, metrics): tensors are [B, R] over response tokens, config is the ActorConfig, agg_kwargs
(num_tokens, num_seqs, norm_length, dp_size, and `weights`: the rollout-correction IS weights when enabled) go to
agg_loss, which multiplies each token's loss by its weight, and metrics holds detached 0-dim tensors pg_clipfrac,
pg_clipfrac_lower and ppo_kl (the mean of old - new log-prob), so the worker can reduce them without a host sync
per micro-batch. ratio = pi / pi_old throughout. Definitions follow veRL 0.9.1's core_algos; where they differ the
loss's docstring says so.

Modules: ppo (ratio-clipped objectives: vanilla, gspo, geo_mean, sapo), trust_region (dppo_tv, dppo_kl),
log_prob (objectives on log pi: cispo, gpg, dro), covariance (clip_cov, kl_cov), bypass (veRL's bypass_mode).
"""

import torch

from verlx.algorithms.policy_losses import bypass, covariance, log_prob, ppo, trust_region  # noqa: F401  (register)
from verlx.algorithms.policy_losses.base import POLICY_LOSSES, PolicyLossFn
from verlx.algorithms.policy_losses.bypass import select_policy_loss

__all__ = ["POLICY_LOSSES", "PolicyLossFn", "policy_loss_problems", "select_policy_loss"]


def policy_loss_problems(cfg) -> list[str]:
    """The chosen loss's own config errors (each loss raises ValueError naming its key), found before any worker
    starts by evaluating it once on a one-token batch."""
    actor = cfg.actor_rollout_ref.actor
    if cfg.algorithm.rollout_correction.bypass_mode or actor.policy_loss.loss_mode not in POLICY_LOSSES:
        return []  # bypass mode's settings and unknown names are reported by their own checks
    zero = torch.zeros(1, 1)
    try:
        POLICY_LOSSES.get(actor.policy_loss.loss_mode)(zero, zero, zero, torch.ones(1, 1), "token-mean", actor)
    except ValueError as e:
        return [str(e)]
    return []
