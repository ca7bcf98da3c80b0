"""Planted faults for the learning test (tests/e2e/test_learning.py). Each breaks one link of the GRPO loop while
the run still completes normally, so only the learning check can tell.

The workers import this module through actor_rollout_ref.model.external_lib=helpers.learning_faults (which
registers the estimator and loss variants there; the test imports it in the driver), or load an engine from it
with rollout.name=helpers.learning_faults:<Engine>; the worker subclass replaces the trainer's worker class in the
driver (the test monkeypatches it).
"""

from __future__ import annotations

import contextlib

import torch

from verlx.algorithms.advantages import grpo, register_estimator
from verlx.algorithms.policy_losses import POLICY_LOSSES
from verlx.algorithms.policy_losses.ppo import vanilla
from verlx.rollout.base import PolicyWeights
from verlx.rollout.native.engine import NativeEngine
from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker


@register_estimator("grpo_sign_flipped", needs_groups=True)
def grpo_sign_flipped(token_level_rewards, response_mask, index, epsilon: float = 1e-6,
                      norm_adv_by_std_in_grpo: bool = True):
    """(a) GRPO with the advantage's sign flipped: better-than-average samples are pushed down."""
    advantages, returns = grpo(token_level_rewards, response_mask, index, epsilon, norm_adv_by_std_in_grpo)
    return -advantages, -returns


@POLICY_LOSSES.register("vanilla_detached")
def vanilla_detached(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs):
    """(b) PPO clip whose value is right but carries no gradient (only the KL term still trains)."""
    pg_loss, metrics = vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, **agg_kwargs)
    return pg_loss.detach(), metrics


class StaleWeightsNativeEngine(NativeEngine):
    """(c) The native engine dropping every weight push while reporting it complete: it keeps generating with the
    weights it loaded."""

    def _load_weights(self, named_tensors) -> set[str]:
        for _ in named_tensors:  # the stream is consumed, as a real push would, and thrown away
            pass
        return set()


class ShiftedMaskNativeEngine(NativeEngine):
    """(d) The native engine returning response masks shifted one token late: the first response token is left
    out of every loss and the token after the stop token is counted in."""

    def generate(self, prompts):
        out = super().generate(prompts)
        mask = out.batch["response_mask"]
        shifted = torch.nn.functional.pad(mask[:, :-1], (1, 0))
        out.batch["response_mask"] = shifted
        out.batch["attention_mask"] = torch.cat([out.batch["attention_mask"][:, : -mask.shape[1]], shifted], dim=-1)
        return out


class ReferenceRolloutWorker(ActorRolloutRefWorker):
    """(e) The reference used as the actor where the engine gets its weights: every push sends the frozen
    reference's weights, so the engine never generates with what the actor learnt."""

    def _actor_weights(self) -> PolicyWeights | None:
        @contextlib.contextmanager
        def stream():
            with self._on_device(ref=True):
                yield self.ref.engine.rollout_weights(self.engine_ctx.engine_dtype)

        return PolicyWeights(self.actor_version, stream)
