"""KL between the policy and the reference: per-token estimators, the in-reward penalty and its controllers.

Estimators (Schulman, "Approximating KL divergence", 2020; log r = log pi - log pi_ref, samples from pi):
  kl / k1      log r                          unbiased, high variance, can be negative
  abs          |log r|
  mse / k2     0.5 (log r)^2                  biased, low variance
  low_var_kl/k3  exp(-log r) + log r - 1      unbiased, >= 0, low variance; clamped to [-10, 10]
  full         sum_v p_v (log p_v - log q_v)  exact per-token KL from both full distributions

A trailing "+" (kl+, k1+, abs+, low_var_kl+, k3+; mse+ / k2+ are k2 itself) is veRL's straight-through variant: the
value is the named estimator's, the gradient is k2's, (log r) d log pi, whose expectation is the gradient of
KL(pi || pi_ref) under samples from pi, which k1's and k3's gradients are not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from verlx.algorithms.core import masked_mean
from verlx.utils.registry import Registry


@dataclass(frozen=True)
class KLPenalty:
    """A per-token KL estimator. If needs_full_distribution, the worker computes the value from logits
    (full_kl_from_logits) and the estimator only checks that it was given."""

    fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None
    needs_full_distribution: bool = False


KL_PENALTIES: Registry[KLPenalty] = Registry("KL penalty")


def _register(names: tuple[str, ...], penalty: KLPenalty) -> None:
    for name in names:
        KL_PENALTIES.register(name)(penalty)


def _k1(logprob, ref_logprob):
    return logprob - ref_logprob


def _abs(logprob, ref_logprob):
    return (logprob - ref_logprob).abs()


def _k2(logprob, ref_logprob):
    return 0.5 * (logprob - ref_logprob).square()


def _k3(logprob, ref_logprob):
    log_ref_ratio = torch.clamp(ref_logprob - logprob, -20, 20)
    return torch.clamp(torch.exp(log_ref_ratio) - log_ref_ratio - 1, -10, 10)


_register(("kl", "k1"), KLPenalty(_k1))
_register(("abs",), KLPenalty(_abs))
_register(("mse", "k2"), KLPenalty(_k2))
_register(("low_var_kl", "k3"), KLPenalty(_k3))
_register(("full",), KLPenalty(None, needs_full_distribution=True))


def _straight_through(value_fn):
    """value_fn's value with k2's gradient: k2 - sg(k2) + sg(value)."""
    def estimate(logprob, ref_logprob):
        k2 = _k2(logprob, ref_logprob)
        return k2 - k2.detach() + value_fn(logprob, ref_logprob).detach()

    return estimate


_register(("kl+", "k1+"), KLPenalty(_straight_through(_k1)))
_register(("abs+",), KLPenalty(_straight_through(_abs)))
_register(("mse+", "k2+"), KLPenalty(_k2))
_register(("low_var_kl+", "k3+"), KLPenalty(_straight_through(_k3)))


def kl_needs_full_distribution(kind: str) -> bool:
    """Whether the worker must compute full_kl_from_logits for this estimator."""
    return KL_PENALTIES.get(kind).needs_full_distribution


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str,
               full_kl: torch.Tensor | None = None) -> torch.Tensor:
    """Per-token KL estimate [B, R] between the policy (logprob) and the reference (ref_logprob)."""
    return _estimate_kl(logprob, ref_logprob, kind, full_kl)


def _estimate_kl(logprob, ref_logprob, kind, full_kl):
    penalty = KL_PENALTIES.get(kind)
    if not penalty.needs_full_distribution:
        return penalty.fn(logprob, ref_logprob)
    if full_kl is None:
        raise ValueError(
            f"KL penalty '{kind}' needs the exact per-token KL from both models' logits: compute it with "
            "full_kl_from_logits(logits, ref_logits) chunk by chunk and pass it as full_kl, or pick an estimator "
            "that needs only log-probs (kl, abs, mse, low_var_kl)"
        )
    if full_kl.shape != logprob.shape:
        raise ValueError(f"full_kl has shape {tuple(full_kl.shape)}, expected {tuple(logprob.shape)} like logprob")
    return full_kl


def full_kl_from_logits(logits: torch.Tensor, ref_logits: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row of two [N, V] logit tensors, p = softmax(logits) (policy), q = softmax(ref_logits).
    Vocabulary entries with p = 0 contribute 0 (also where both logits are -inf)."""
    if logits.shape != ref_logits.shape:
        raise ValueError(f"logits {tuple(logits.shape)} and ref_logits {tuple(ref_logits.shape)} differ in shape")
    dtype = torch.promote_types(logits.dtype, torch.float32)  # bf16 logits are reduced in float32
    log_p = torch.log_softmax(logits.to(dtype), dim=-1)
    log_q = torch.log_softmax(ref_logits.to(dtype), dim=-1)
    p = torch.exp(log_p)
    diff = torch.where(p > 0, log_p - log_q, torch.zeros_like(log_p))
    return (p * diff).sum(dim=-1)


class FixedKLController:
    """A constant coefficient."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        pass


class AdaptiveKLController:
    """Proportional controller of Ziegler et al. 2019 (arXiv:1909.08593): beta *= 1 + e * n_steps / horizon with
    e = clip(KL / target - 1, -0.2, 0.2), so the measured KL is steered towards target_kl."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1, -0.2, 0.2))
        self.value *= 1 + error * n_steps / self.horizon


KL_CONTROLLERS: Registry[Callable] = Registry("KL controller", "algorithm.kl_ctrl.type")


@KL_CONTROLLERS.register("fixed")
def _fixed(cfg) -> FixedKLController:
    return FixedKLController(cfg.kl_coef)


@KL_CONTROLLERS.register("adaptive")
def _adaptive(cfg) -> AdaptiveKLController:
    if not cfg.horizon > 0:
        raise ValueError(f"algorithm.kl_ctrl.horizon={cfg.horizon} must be > 0 for the adaptive KL controller")
    if not cfg.target_kl > 0:
        raise ValueError(f"algorithm.kl_ctrl.target_kl={cfg.target_kl} must be > 0 for the adaptive KL controller")
    return AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.horizon)


def make_kl_controller(cfg):
    """The controller for algorithm.kl_ctrl (KLControlConfig)."""
    return KL_CONTROLLERS.get(cfg.type)(cfg)


def apply_kl_penalty(data, kl_ctrl, kl_penalty: str = "kl"):
    """token_level_rewards = token_level_scores - beta * KL(old_log_probs, ref_log_prob) on response tokens; the
    controller is then updated with the batch's KL (mean over samples of the per-sample token mean).
    With kind 'full' the batch must carry 'full_kl' [B, R] from the workers."""
    batch = data.batch
    mask = batch["response_mask"].to(batch["token_level_scores"].dtype)
    kld = _estimate_kl(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty, batch.get("full_kl")) * mask
    beta = kl_ctrl.value
    batch["token_level_rewards"] = batch["token_level_scores"] - beta * kld
    current_kl = float(masked_mean(kld, mask, dim=-1).mean())
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": float(beta)}
