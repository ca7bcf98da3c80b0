"""The step's old-log-prob phase: π_old recomputed by the actor (or, in rollout-correction bypass mode, taken from
the rollout engine), the entropy metric, sum_v π_v² when an estimator needs it, and rollout correction.

Decoupled mode (the default; three policies π_rollout, π_old, π_θ): the actor recomputes old_log_probs, and when
the engine returned its log-probs the rollout-correction weights and rejection mask are computed once per batch
against them (algorithm.rollout_correction). Bypass mode (two policies): old_log_probs = rollout_log_probs and the
actor forward is skipped; the actor's loss computes the correction per micro-batch against the current policy
(algorithms/policy_losses/bypass.py).
"""

from __future__ import annotations

import torch

from verlx.algorithms.advantages import needs_sum_pi_squared
from verlx.algorithms.core import agg_loss, masked_mean
from verlx.algorithms.rollout_correction import Correction, rollout_correction
from verlx.batch_columns import select_inputs
from verlx.protocol import DataProto
from verlx.utils.timer import timed


def old_log_prob_phase(config, actor_wg, batch: DataProto, input_keys, metrics: dict,
                       timing: dict) -> Correction | None:
    """Write batch['old_log_probs'] (and 'sum_pi_squared', 'rollout_is_weights' when there are any); returns the
    decoupled rollout correction, or None (no engine log-probs, or bypass mode)."""
    rc = config.algorithm.rollout_correction
    if rc.bypass_mode:
        if "rollout_log_probs" not in batch.batch:
            raise ValueError("algorithm.rollout_correction.bypass_mode=true needs the engine's log-probs "
                             "(batch key rollout_log_probs); set actor_rollout_ref.rollout.calculate_log_probs=true")
        batch.batch["old_log_probs"] = batch.batch["rollout_log_probs"]
        return None
    with timed("old_log_prob", timing):
        inputs = select_inputs(batch, input_keys)
        inputs.meta_info["calculate_sum_pi_squared"] = needs_sum_pi_squared(config)
        old = actor_wg.compute_log_prob(inputs)
        metrics.update(old.meta_info.get("metrics", {}))
        actor = config.actor_rollout_ref.actor
        entropy = agg_loss(old.batch["entropys"], batch.batch["response_mask"], actor.loss_agg_mode,
                           norm_length=actor.loss_scale_factor)
        metrics["actor/entropy"] = float(entropy)
        batch.batch["old_log_probs"] = old.batch["old_log_probs"]
        if "sum_pi_squared" in old.batch:
            batch.batch["sum_pi_squared"] = old.batch["sum_pi_squared"]
    if "rollout_log_probs" not in batch.batch:
        return None
    metrics.update(_logprob_diff(batch))
    correction = rollout_correction(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"],
                                    batch.batch["response_mask"], rc)
    metrics.update(correction.metrics)
    if correction.weights is not None:
        batch.batch["rollout_is_weights"] = correction.weights.to(torch.float32)
    return correction


def _logprob_diff(batch: DataProto) -> dict[str, float]:
    mask = batch.batch["response_mask"].bool()
    diff = (batch.batch["rollout_log_probs"] - batch.batch["old_log_probs"]).abs()
    return {
        "rollout/logprob_diff": float(masked_mean(diff, mask)),
        "rollout/logprob_diff_max": float(diff[mask].max()) if mask.any() else 0.0,
    }
