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
import math

import torch

from verlx.batch_columns import select_inputs
from verlx.utils.errors import VerlxError
from verlx.workers.guarded_step import NonFiniteUpdates

logger = logging.getLogger(__name__)


class InvariantError(VerlxError, RuntimeError):
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
    if not math.isfinite(diff):
        if metrics.get("actor/nonfinite_updates_skipped", 0) > 0:
            return  # the weights or the loss are no longer finite: the non-finite update guard counts and stops it
        raise InvariantError(
            f"on-policy check at step {step}: the actor's log-probs are not finite ({diff}), so the weights are not "
            "either; the usual cause is a learning rate far too large (actor_rollout_ref.actor.optim.lr)")
    raise InvariantError(
        f"on-policy check failed at step {step}: the actor update's first forward (first mini-batch, first PPO "
        f"epoch, the weights old_log_prob was computed with) differs from old_log_prob by up to {diff:.3g} "
        f"(trainer.on_policy_tolerance={tolerance:g}; actor/ppo_kl_first_mini_batch="
        f"{metrics.get('actor/ppo_kl_first_mini_batch', float('nan')):.3g}). The two forwards do not compute the "
        "same thing: dropout or other train-mode randomness (see actor_rollout_ref.model.override_config), samples "
        "out of order with their old_log_probs, or GPU kernels that depend on the micro-batch shape (make "
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu equal actor.ppo_micro_batch_size_per_gpu, or "
        "allow the noise with trainer.on_policy_tolerance)")


def check_finite_log_probs(old_log_probs, response_mask, step: int, lr: float, when: str = "before") -> None:
    """The current weights must give finite log-probs: once they do not, every later update is skipped as
    non-finite and the weights never change again, so the run stops now, naming the likely cause, instead of
    generating from NaN probabilities. `when`: before or after the step's update."""
    bad = response_mask.bool() & ~torch.isfinite(old_log_probs)
    count = int(bad.sum())
    if count:
        raise NonFiniteUpdates(
            f"step {step}: {count} of {int(response_mask.sum())} response tokens have a non-finite log-prob under the "
            f"weights {when} this step's update: the weights no longer compute finite numbers, and skipped updates "
            "cannot repair them. The usual cause is a learning rate far too large "
            f"(actor_rollout_ref.actor.optim.lr={lr:g}): resume from an earlier checkpoint with a smaller one")


def check_weights_after_skipped_updates(metrics: dict, actor_wg, batch, input_keys, world_size: int, step: int,
                                        lr: float) -> None:
    """After an update that skipped non-finite mini-batches, one log-prob pass over `world_size` samples tells a
    passing NaN (the weights are fine, training goes on) from weights that diverged (the run stops)."""
    if not metrics.get("actor/nonfinite_updates_skipped"):
        return
    probe = select_inputs(batch, input_keys)[:world_size]
    out = actor_wg.compute_log_prob(probe)
    check_finite_log_probs(out.batch["old_log_probs"], probe.batch["response_mask"], step, lr, when="after")
