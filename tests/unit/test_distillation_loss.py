"""On-policy distillation's loss (algorithms/distillation.py) and its combination with the policy loss
(workers/actor.compose_distillation_loss) on a 2×3 toy batch, every number worked out by hand below.

    student S = [[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]]     teacher T = [[-1.5, -1.0, -0.5], [-0.7, -1.0, -10.0]]
    mask      = [[1, 1, 1], [1, 1, 0]]                        (5 valid tokens; the last one is padding)
    T - S     = [[-0.5, 1.0, 0.0], [-0.5, 2.0, -9.0]]
    k3 = e^(T-S) - (T-S) - 1 = [[0.10653066, 0.71828183, 0], [0.10653066, 4.38905610, 8.00012341 (masked)]]
    k1 = S - T               = [[0.5, -1.0, 0.0], [0.5, -2.0, 9.0 (masked)]]
"""

from __future__ import annotations

import pytest
import torch

from verlx.algorithms.distillation import distillation_loss
from verlx.algorithms.kl import kl_penalty
from verlx.config.distillation import DistillationLossConfig

S = [[-1.0, -2.0, -0.5], [-0.2, -3.0, -1.0]]
T = [[-1.5, -1.0, -0.5], [-0.7, -1.0, -10.0]]
MASK = [[1, 1, 1], [1, 1, 0]]
# old log-probs of the policy-gradient form: log ratio S - OLD = [[0, 0.3, 0], [0.3, 0, 0]]
OLD = [[-1.0, -2.3, -0.5], [-0.5, -3.0, -1.0]]


def _loss(config, student, teacher, old, mask, mode, **kwargs):
    """The estimator modes' per-token losses, kl_penalty(student, teacher), into distillation_loss."""
    return distillation_loss(config, kl_penalty(student, teacher, config.loss_mode), student, old, mask, mode,
                             **kwargs)


def _tensors(student=S):
    return (torch.tensor(student, dtype=torch.float64, requires_grad=True), torch.tensor(T, dtype=torch.float64),
            torch.tensor(OLD, dtype=torch.float64), torch.tensor(MASK))


def test_k3_minimised_directly_is_the_token_mean_of_the_clamped_estimate():
    student, teacher, old, mask = _tensors()
    # no clamp: (0.10653066 + 0.71828183 + 0 + 0.10653066 + 4.38905610) / 5 = 5.32039925 / 5
    out = _loss(DistillationLossConfig(loss_mode="k3"), student, teacher, old, mask, "token-mean")
    assert out.loss.item() == pytest.approx(1.06407985, abs=1e-7)
    # extremes over the valid tokens only (the padded 8.00012341 is not one), before any clamp
    assert (out.loss_min.item(), out.loss_max.item()) == pytest.approx((0.0, 4.38905610), abs=1e-7)
    assert out.means["distillation/abs_loss"].item() == pytest.approx(1.06407985, abs=1e-7)
    # loss_max_clamp=1: 4.38905610 becomes 1 -> (0.10653066 + 0.71828183 + 0 + 0.10653066 + 1) / 5 = 1.93134315 / 5
    clamped = _loss(DistillationLossConfig(loss_mode="k3", loss_max_clamp=1.0), student, teacher, old,
                                mask, "token-mean")
    assert clamped.loss.item() == pytest.approx(0.38626863, abs=1e-7)
    assert clamped.loss_max.item() == pytest.approx(4.38905610, abs=1e-7)  # reported before clamping
    assert clamped.means["distillation/abs_loss"].item() == pytest.approx(1.06407985, abs=1e-7)
    # the gradient reaches the student: d/dS of k3 = 1 - e^(T-S); token (0, 1): (1 - e) / 5 = -0.34365637
    clamped.loss.backward()
    assert student.grad[0, 1].item() == pytest.approx(-0.34365637, abs=1e-7)
    assert student.grad[1, 1].item() == 0.0  # clamped: no gradient
    assert student.grad[1, 2].item() == 0.0  # padding


def test_k1_as_a_reward_is_the_ppo_clipped_loss_with_advantage_minus_the_clamped_loss():
    student, teacher, old, mask = _tensors()
    cfg = DistillationLossConfig(loss_mode="k1", loss_max_clamp=1.0, use_policy_gradient=True)
    out = _loss(cfg, student, teacher, old, mask, "token-mean")
    # k1 clamped to ±1: [[0.5, -1, 0], [0.5, -1, 1]] -> advantages A = [[-0.5, 1, 0], [-0.5, 1, -1]]
    # ratio r = e^(S - OLD) = [[1, 1.34985881, 1], [1.34985881, 1, 1]], clip range [0.8, 1.2]
    # per token max(-A r, -A clip(r)):
    #   (0,0) max(0.5, 0.5) = 0.5        (0,1) max(-1.34985881, -1.2) = -1.2 (clipped)   (0,2) 0
    #   (1,0) max(0.67492940, 0.6) = 0.67492940                                          (1,1) max(-1, -1) = -1
    # token-mean: (0.5 - 1.2 + 0 + 0.67492940 - 1) / 5 = -1.0250706 / 5
    assert out.loss.item() == pytest.approx(-0.20501412, abs=1e-7)
    assert out.means["distillation/pg_clipfrac"].item() == pytest.approx(0.2)  # token (0,1) of 5
    assert out.means["distillation/ppo_kl"].item() == pytest.approx(-0.12)  # mean(OLD - S) = -0.6 / 5
    # extremes and abs_loss of k1 before the clamp: min -2, max 0.5, (0.5 + 1 + 0 + 0.5 + 2) / 5
    assert (out.loss_min.item(), out.loss_max.item()) == pytest.approx((-2.0, 0.5))
    assert out.means["distillation/abs_loss"].item() == pytest.approx(0.8)
    # the advantages are detached: the gradient is the PPO one, -A r / 5 where not clipped
    # (0,0): 0.5 / 5 = 0.1; (0,1) clipped: 0; (1,0): 0.67492940 / 5 = 0.13498588; (1,1): -1 / 5 = -0.2
    out.loss.backward()
    expected = torch.tensor([[0.1, 0.0, 0.0], [0.13498588, -0.2, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(student.grad, expected, atol=1e-7, rtol=0)


def _micro_batch(advantages: float, old):
    from verlx.protocol import DataProto

    return DataProto({"response_mask": torch.tensor(MASK), "teacher_log_prob": torch.tensor(T, dtype=torch.float64),
                      "old_log_probs": torch.tensor(old, dtype=torch.float64),
                      "advantages": torch.full((2, 3), advantages, dtype=torch.float64) * torch.tensor(MASK)})


def _compose(distill: DistillationLossConfig, old=S) -> tuple[float, dict]:
    from verlx.algorithms.policy_losses import POLICY_LOSSES
    from verlx.config.roles import ActorConfig
    from verlx.metrics.accumulator import MetricAccumulator
    from verlx.workers.actor import compose_distillation_loss

    metrics = MetricAccumulator(torch.device("cpu"))
    counts = {"num_tokens": 5, "num_seqs": 2, "dp_size": 1, "rank_tokens": 5}
    out = {"log_prob": torch.tensor(S, dtype=torch.float64, requires_grad=True), "entropy": None}
    loss = compose_distillation_loss(ActorConfig(), distill, POLICY_LOSSES.get("vanilla"), _micro_batch(1.0, old),
                                     out, counts, metrics)
    return loss.item(), metrics.reduce()


def test_the_distillation_loss_joins_the_policy_loss_as_veRL_combines_them():
    # the task's policy loss: advantages 1 and old = S (ratio 1) -> -1 per token, token-mean -1
    loss, metrics = _compose(DistillationLossConfig(loss_mode="k3", distillation_loss_coef=0.5))
    assert loss == pytest.approx(-1 + 0.5 * 1.06407985, abs=1e-7)  # policy + coef × distillation
    assert metrics["actor/pg_loss"] == pytest.approx(-1.0)
    assert metrics["distillation/loss"] == pytest.approx(1.06407985, abs=1e-7)
    assert (metrics["distillation/loss_min"], metrics["distillation/loss_max"]) == pytest.approx((0.0, 4.38905610))
    # without task rewards the coefficient is 1 and the policy loss is not computed at all
    loss, metrics = _compose(DistillationLossConfig(loss_mode="k3", distillation_loss_coef=0.5,
                                                    use_task_rewards=False))
    assert loss == pytest.approx(1.06407985, abs=1e-7)
    assert "actor/pg_loss" not in metrics
    # as a reward without task rewards: the policy loss is computed for its metrics and left out of the loss
    loss, metrics = _compose(DistillationLossConfig(loss_mode="k1", loss_max_clamp=1.0, use_task_rewards=False,
                                                    use_policy_gradient=True), old=OLD)
    assert loss == pytest.approx(-0.20501412, abs=1e-7)
    assert "actor/pg_loss" in metrics and metrics["distillation/pg_clipfrac"] == pytest.approx(0.2)
