"""Checks every training step runs, failing loudly (docs/async.md, "Invariants").

The on-policy check: the actor update's first mini-batch of its first PPO epoch runs before any optimizer step,
with the weights old_log_prob was just computed with (in every rollout mode the trainer recomputes old_log_prob
with its current weights). Its log-probs must therefore equal old_log_probs exactly when both forwards run the
same kernels on the same numbers: no train-mode randomness (dropout) and kernels whose result for a sample does
not depend on the rest of its micro-batch (true on CPU; on GPU only when the log-prob micro-batches equal the
update's). Then actor/on_policy_log_prob_diff_max and actor/ppo_kl_first_mini_batch are 0, and with one
mini-batch per step and ppo_epochs=1 so is actor/ppo_kl.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


class InvariantError(RuntimeError):
    """A property that holds by construction was violated: the run stops rather than train on it."""


def on_policy_tolerance(trainer_cfg) -> float | None:
    """trainer.on_policy_tolerance, or for null: 0.0 on CPU and None (logged, not enforced) on GPU."""
    if trainer_cfg.on_policy_tolerance is not None:
        return float(trainer_cfg.on_policy_tolerance)
    return None if trainer_cfg.device == "cuda" else 0.0


def check_on_policy(metrics: dict[str, float], tolerance: float | None, step: int) -> None:
    diff = metrics.get("actor/on_policy_log_prob_diff_max")
    if tolerance is None or diff is None or diff <= tolerance:
        return
    raise InvariantError(
        f"on-policy check failed at step {step}: the actor update's first forward (first mini-batch, first PPO "
        f"epoch, the weights old_log_prob was computed with) differs from old_log_prob by up to {diff:.3g} "
        f"(trainer.on_policy_tolerance={tolerance:g}; actor/ppo_kl_first_mini_batch="
        f"{metrics.get('actor/ppo_kl_first_mini_batch', float('nan')):.3g}). The two forwards do not compute the "
        "same thing: dropout or other train-mode randomness (see actor_rollout_ref.model.override_config), samples "
        "out of order with their old_log_probs, or GPU kernels that depend on the micro-batch shape (make "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu equal actor.ppo_micro_batch_size_per_gpu, or "
        "allow the noise with trainer.on_policy_tolerance)")
