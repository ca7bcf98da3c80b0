"""Rollout-correction bypass mode (veRL's bypass_mode / loss_type): the loss against π_rollout with the correction
computed per micro-batch from the current policy, hand-worked; its config checks; and the driver's phase that
skips the old-log-prob forward."""

from __future__ import annotations

import math

import pytest
import torch

from verlx.algorithms.policy_losses import POLICY_LOSSES, policy_loss_problems, select_policy_loss
from verlx.algorithms.rollout_correction import rollout_correction_problems
from verlx.config.loader import build, load_yaml, to_container
from verlx.config.run import RolloutCorrectionConfig
from verlx.config.schema import PPOConfig
from verlx.protocol import DataProto
from verlx.trainer.old_log_prob import old_log_prob_phase

# current / rollout ratios 1.5, 3, 0.5 on three valid tokens
LOG_PROB = [-1.0, -0.5, -2.0]
RATIOS = [1.5, 3.0, 0.5]
ADV = torch.tensor([[1.0, 1.0, -1.0]], dtype=torch.float64)
MASK = torch.ones(1, 3, dtype=torch.float64)


def config(**overrides) -> PPOConfig:
    keys = [f"algorithm.rollout_correction.{k}={v}" for k, v in {"bypass_mode": "true", **overrides}.items()]
    return build(PPOConfig, to_container(load_yaml(overrides=keys)))


def bypass_loss(cfg: PPOConfig, **agg_kwargs):
    log_prob = torch.tensor([LOG_PROB], dtype=torch.float64, requires_grad=True)
    rollout = log_prob.detach() - torch.log(torch.tensor([RATIOS], dtype=torch.float64))
    loss_fn = select_policy_loss(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction)
    loss, metrics = loss_fn(rollout, log_prob, ADV, MASK, "token-mean", cfg.actor_rollout_ref.actor, **agg_kwargs)
    loss.backward()
    return loss.item(), {k: v.item() for k, v in metrics.items()}, log_prob.grad[0].tolist()


def test_reinforce_weights_the_policy_gradient_by_the_truncated_ratio_to_the_rollout():
    loss, metrics, grad = bypass_loss(config(loss_type="reinforce", rollout_is="token"))
    # w = min(pi / pi_rollout, 2) = 1.5, 2, 0.5 (detached); loss -A w log pi = 1.5, 1.0, -1.0 -> mean 0.5
    assert loss == pytest.approx(0.5)
    assert grad == pytest.approx([-1.5 / 3, -2.0 / 3, 0.5 / 3])  # -A w / 3
    assert metrics["ppo_kl"] == pytest.approx(-math.log(1.5 * 3.0 * 0.5) / 3)  # mean(log pi_rollout - log pi)
    # the correction's metrics, between the current policy and pi_rollout, under their own names
    assert metrics["rollout_corr/kl"] == pytest.approx(-math.log(2.25) / 3)
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(4.0 / 3)


def test_reinforce_without_is_weights_is_plain_reinforce():
    loss, _, grad = bypass_loss(config(loss_type="reinforce"))
    assert loss == pytest.approx((1.0 + 0.5 - 2.0) / 3)  # -A log pi
    assert grad == pytest.approx([-1 / 3, -1 / 3, 1 / 3])


def test_ppo_clip_uses_the_ratio_to_the_rollout_and_never_the_is_weights():
    loss, metrics, grad = bypass_loss(config(rollout_is="token"))  # loss_type defaults to ppo_clip
    # clip [0.8, 1.2]: max(-1.5, -1.2) = -1.2; max(-3, -1.2) = -1.2; A=-1 r=0.5: max(0.5, 0.8) = 0.8
    assert loss == pytest.approx((-1.2 - 1.2 + 0.8) / 3)
    assert grad == pytest.approx([0.0, 0.0, 0.0])  # every token is clipped
    assert metrics["pg_clipfrac"] == pytest.approx(1.0)


def test_rejected_tokens_leave_the_loss_and_the_mini_batch_counts_still_divide():
    cfg = config(loss_type="reinforce", rollout_rs="token_k1", rollout_rs_threshold="0.4_2.5")
    loss, metrics, _ = bypass_loss(cfg)
    # r = 3 is outside [0.4, 2.5]: -A log pi of the other two = 1 - 2 over the 2 kept tokens
    assert loss == pytest.approx(-0.5)
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 3)
    loss, _, _ = bypass_loss(cfg, num_tokens=3.0)  # the worker passes the mini-batch's count of the original mask
    assert loss == pytest.approx(-1 / 3)


def test_bypass_replaces_loss_mode_and_loss_mode_bypass_needs_the_switch():
    cfg = config()
    cfg.actor_rollout_ref.actor.policy_loss.loss_mode = "gspo"
    assert select_policy_loss(cfg.actor_rollout_ref.actor, cfg.algorithm.rollout_correction).func \
        is POLICY_LOSSES.get("bypass_mode")
    plain = build(PPOConfig, to_container(load_yaml(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=gspo"])))
    assert select_policy_loss(plain.actor_rollout_ref.actor, plain.algorithm.rollout_correction) \
        is POLICY_LOSSES.get("gspo")
    wrong = build(PPOConfig, to_container(load_yaml(
        overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"])))
    (problem,) = policy_loss_problems(wrong)
    assert "set algorithm.rollout_correction.bypass_mode=true" in problem


@pytest.mark.parametrize("overrides,message", [
    ({"loss_type": "reinforc"}, "Did you mean 'reinforce'?"),
])
def test_bad_bypass_config_is_named(overrides, message):
    problems = rollout_correction_problems(config(**overrides))
    assert any(message in p for p in problems), problems


def test_bypass_needs_the_engine_log_probs():
    cfg = config()
    cfg.actor_rollout_ref.rollout.calculate_log_probs = False
    assert any("calculate_log_probs=true" in p for p in rollout_correction_problems(cfg))


class RecordingActor:
    """Stands in for the actor worker group: records whether the old-log-prob forward ran and what it was asked."""

    def __init__(self):
        self.calls = []

    def compute_log_prob(self, data: DataProto) -> DataProto:
        self.calls.append(dict(data.meta_info))
        shape = data.batch["responses"].shape
        out = {"old_log_probs": torch.full(shape, -1.0), "entropys": torch.ones(shape)}
        if data.meta_info.get("calculate_sum_pi_squared"):
            out["sum_pi_squared"] = torch.full(shape, 0.5)
        return DataProto(out, meta_info={"metrics": {}})


def phase_batch() -> DataProto:
    return DataProto({"responses": torch.zeros(2, 3, dtype=torch.long), "response_mask": torch.ones(2, 3),
                      "rollout_log_probs": torch.full((2, 3), -1.5), "input_ids": torch.zeros(2, 5, dtype=torch.long),
                      "attention_mask": torch.ones(2, 5), "position_ids": torch.zeros(2, 5, dtype=torch.long)})


def test_bypass_skips_the_old_log_prob_forward():
    actor, batch, metrics, timing = RecordingActor(), phase_batch(), {}, {}
    correction = old_log_prob_phase(config(), actor, batch, ["input_ids", "responses"], metrics, timing)
    assert actor.calls == [] and correction is None and "old_log_prob" not in timing
    assert torch.equal(batch.batch["old_log_probs"], batch.batch["rollout_log_probs"])
    assert "actor/entropy" not in metrics and not any(k.startswith("rollout_corr/") for k in metrics)


def test_decoupled_mode_recomputes_and_corrects_and_asks_for_sum_pi_squared_when_needed():
    cfg = build(PPOConfig, to_container(load_yaml(overrides=[
        "algorithm.adv_estimator=optimal_token_baseline", "algorithm.rollout_correction.rollout_is=token"])))
    actor, batch, metrics, timing = RecordingActor(), phase_batch(), {}, {}
    correction = old_log_prob_phase(cfg, actor, batch, ["input_ids", "responses"], metrics, timing)
    assert actor.calls == [{"calculate_sum_pi_squared": True}] and "old_log_prob" in timing
    assert torch.equal(batch.batch["sum_pi_squared"], torch.full((2, 3), 0.5))
    # log r = -1 - (-1.5) = 0.5 everywhere: the truncated weight e^0.5 is in the batch for the estimator
    torch.testing.assert_close(batch.batch["rollout_is_weights"], torch.full((2, 3), math.exp(0.5)))
    assert correction.weights is not None and metrics["rollout_corr/kl"] == pytest.approx(-0.5)
    assert metrics["actor/entropy"] == 1.0


def test_bypass_without_engine_log_probs_fails_naming_the_key():
    batch = phase_batch()
    batch.pop(batch_keys=["rollout_log_probs"])
    with pytest.raises(ValueError, match="calculate_log_probs=true"):
        old_log_prob_phase(config(), RecordingActor(), batch, ["input_ids"], {}, {})


def test_config_keys_and_defaults_match_verl():
    rc = RolloutCorrectionConfig()
    assert (rc.bypass_mode, rc.loss_type) == (False, "ppo_clip")
