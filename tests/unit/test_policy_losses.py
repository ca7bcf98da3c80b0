"""Policy losses: values, metrics and gradients against hand-worked examples."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.policy_loss_cases import inputs, run
from helpers.registries import shipped_names
from verlx.algorithms.policy_losses import POLICY_LOSSES
from verlx.config.roles import ActorConfig, PolicyLossConfig


def test_vanilla_asymmetric_and_dual_clip():
    config = ActorConfig(clip_ratio=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)  # ratio range [0.8, 1.28]
    old, logp, a, m = inputs(
        [-1.0] * 6, ratio=[1.5, 0.5, 0.5, 4.0, 1.0, math.exp(5)], advantages=[1, 1, -1, -1, -2, 100],
        mask=[1, 1, 1, 1, 1, 0],
    )
    loss, metrics, grad = run("vanilla", old, logp, a, m, config)
    # t0 A=+1 r=1.5: max(-1.5, -1.28) = -1.28 (clipped)      t1 A=+1 r=0.5: max(-0.5, -0.8) = -0.5
    # t2 A=-1 r=0.5: max(0.5, 0.8) = 0.8 (clipped)            t3 A=-1 r=4: max(4, 1.28) = 4 -> dual cap 3 * 1 = 3
    # t4 A=-2 r=1: 2 (cap 6 not reached)                      t5 masked
    assert loss == pytest.approx((-1.28 - 0.5 + 0.8 + 3.0 + 2.0) / 5)  # 0.804
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 5)  # t0, t2
    assert metrics["pg_clipfrac_lower"] == pytest.approx(1 / 5)  # t3
    # ppo_kl = mean(old - new) = -(ln 1.5 + ln 0.5 + ln 0.5 + ln 4 + 0) / 5 = -ln(1.5) / 5
    assert metrics["ppo_kl"] == pytest.approx(-0.0810930, abs=1e-7)
    # d/dlogp of -A * r is -A * r on unclipped tokens (/5 tokens), 0 where a clip or the cap is active
    assert grad == pytest.approx([0.0, -0.5 / 5, 0.0, 0.0, 2.0 / 5, 0.0])


def test_vanilla_symmetric_clip_uses_clip_ratio_for_both_sides():
    config = ActorConfig(clip_ratio=0.1)  # [0.9, 1.1]
    old, logp, a, m = inputs([-1.0, -1.0], ratio=[1.2, 0.5], advantages=[1, -1], mask=[1, 1])
    loss, metrics, _ = run("vanilla", old, logp, a, m, config)
    # t0: max(-1.2, -1.1) = -1.1; t1: max(0.5, 0.9) = 0.9 -> mean -0.1, both clipped
    assert loss == pytest.approx(-0.1) and metrics["pg_clipfrac"] == 1.0


def test_vanilla_rejects_clip_ratio_c_not_above_one():
    old, logp, a, m = inputs([-1.0], ratio=[1.0], advantages=[1], mask=[1])
    with pytest.raises(ValueError, match="clip_ratio_c=1.0 must be > 1"):
        POLICY_LOSSES.get("vanilla")(old, logp, a, m, "token-mean", ActorConfig(clip_ratio_c=1.0))


def gspo_inputs():
    """Three sequences: one inside the clip range, one at ratio 1, one clipped above (its third token masked)."""
    return inputs(
        [[-1.0, -2.0, -3.0], [-1.0, -1.5, -0.5], [-2.0, -2.0, -9.0]],
        ratio=[[math.exp(0.2), 1.0, 1.0], [math.exp(0.1), math.exp(-0.3), math.exp(0.2)], [2.0, 2.0, 7.0]],
        advantages=[[1, 1, 1], [-1, -1, -1], [1, 1, 1]],
        mask=[[1, 1, 0], [1, 1, 1], [1, 1, 0]],
    )


def test_gspo_sequence_ratio_and_stop_gradient():
    config = ActorConfig(clip_ratio=0.2, clip_ratio_high=0.28)
    old, logp, a, m = gspo_inputs()
    loss, metrics, grad = run("gspo", old, logp, a, m, config, agg="seq-mean-token-mean")
    # sequence ratios s = exp(mean log ratio): seq0 exp(0.2/2) = 1.105171 (inside [0.8, 1.28]),
    #   seq1 exp((0.1 - 0.3 + 0.2)/3) = 1, seq2 exp(ln 2) = 2 -> clipped to 1.28
    # per-token loss -A*s: seq0 -1.105171, seq1 +1, seq2 max(-2, -1.28) = -1.28
    # seq-mean-token-mean (the paper's aggregation): (-1.105171 + 1 - 1.28) / 3
    assert loss == pytest.approx(-0.4617236, abs=1e-7)
    # gradient of every token of sequence i: -A_i * s_i / (|y_i| * 3 sequences), same for all its tokens
    #   seq0: -1.105171 / 6 = -0.184195 on both tokens (a token-level ratio would give -e^0.2/6 and -1/6)
    #   seq1: 1 / 9 = 0.111111; seq2 is clipped: 0
    expected = [[-0.1841952, -0.1841952, 0.0], [1 / 9, 1 / 9, 1 / 9], [0.0, 0.0, 0.0]]
    torch.testing.assert_close(torch.tensor(grad), torch.tensor(expected), rtol=0, atol=1e-7)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 7)  # seq2's two tokens of 7 valid
    # ppo_kl = -(0.2 + 0 + 0.1 - 0.3 + 0.2 + 2 ln 2) / 7
    assert metrics["ppo_kl"] == pytest.approx(-0.2266135, abs=1e-7)
    assert metrics["pg_clipfrac_lower"] == 0.0


def test_gspo_honours_loss_agg_mode_as_verl_0_9_1():
    config = ActorConfig(clip_ratio=0.2, clip_ratio_high=0.28)
    old, logp, a, m = gspo_inputs()
    loss, _, _ = run("gspo", old, logp, a, m, config, agg="token-mean")
    # the same per-token losses averaged over the 7 tokens: (2 * -1.105171 + 3 * 1 + 2 * -1.28) / 7
    assert loss == pytest.approx(-0.2529060, abs=1e-7)


def test_cispo_gradient_flows_through_log_prob_only():
    config = ActorConfig(clip_ratio=0.2, clip_ratio_high=0.28)
    old, logp, a, m = inputs([-0.5, -2.0, -1.0], ratio=[1.5, 0.5, 1.0], advantages=[1, -1, 2], mask=[1, 1, 1])
    loss, metrics, grad = run("cispo", old, logp, a, m, config)
    # weights sg(clip(r)): 1.28, 0.8, 1.0; loss -w * A * logp: -1.28*1*(-0.5) = 0.64, -0.8*(-1)*(-2) = -1.6,
    #   -1*2*(-1) = 2 -> mean 1.04 / 3
    assert loss == pytest.approx(1.04 / 3)
    # gradient -w * A / 3 (the weight is a constant): -1.28/3, 0.8/3, -2/3
    assert grad == pytest.approx([-1.28 / 3, 0.8 / 3, -2 / 3])
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 3)


def test_cispo_with_verls_clip_ratio_low_of_10_has_no_lower_clip():
    """veRL's CISPO example sets clip_ratio_low=10: the weight's lower bound 1 - 10 is below any ratio."""
    config = ActorConfig(clip_ratio=0.2, clip_ratio_low=10.0, clip_ratio_high=0.28)
    old, logp, a, m = inputs([-0.5, -2.0, -1.0], ratio=[1.5, 0.05, 1.0], advantages=[1, -1, 2], mask=[1, 1, 1])
    loss, metrics, grad = run("cispo", old, logp, a, m, config)
    # weights 1.28 (upper clip), 0.05 (not raised to a lower bound), 1.0: losses 0.64, -0.05*2 = -0.1, 2 -> 2.54 / 3
    assert loss == pytest.approx(2.54 / 3)
    assert grad == pytest.approx([-1.28 / 3, 0.05 / 3, -2 / 3])
    assert metrics["pg_clipfrac"] == pytest.approx(1 / 3)


def test_gpg_loss():
    old, logp, a, m = inputs([-0.5, -2.0, -7.0], ratio=[1.0, 1.0, 1.0], advantages=[1, -1, 5], mask=[1, 1, 0])
    loss, metrics, grad = run("gpg", old, logp, a, m, ActorConfig())
    # -A * logp: 0.5, -2 -> mean -0.75; gradient -A / 2
    assert loss == pytest.approx(-0.75) and grad == pytest.approx([-0.5, 0.5, 0.0])
    assert metrics == {"pg_clipfrac": 0.0, "pg_clipfrac_lower": 0.0, "ppo_kl": 0.0}


def cov_config(**policy_loss):
    return ActorConfig(clip_ratio=0.2, policy_loss=PolicyLossConfig(**policy_loss))


# A = 2, 1, -1, -2 (mean 0); log pi = -1, -3, -3, -1 (mean -2) -> covariance A * (log pi + 2) = 2, -1, 1, -2
COV_CASE = dict(log_prob=[-1.0, -3.0, -3.0, -1.0], advantages=[2, 1, -1, -2], mask=[1, 1, 1, 1])


def test_clip_cov_detaches_the_tokens_in_the_covariance_window():
    config = cov_config(loss_mode="clip_cov", clip_cov_ratio=0.5, clip_cov_lb=0.5, clip_cov_ub=5.0)
    old, logp, a, m = inputs(ratio=[1.0] * 4, **COV_CASE)
    loss, metrics, grad = run("clip_cov", old, logp, a, m, config)
    # window (0.5, 5) holds t0 (2) and t2 (1); floor(0.5 * 4) = 2 tokens may be detached -> both
    # losses -A*r = -2, -1, 1, 2 -> 0, -1, 0, 2 -> mean 0.25; gradient -A*r/4 on t1, t3
    assert loss == pytest.approx(0.25)
    assert grad == pytest.approx([0.0, -0.25, 0.0, 0.5])
    assert metrics["pg_clipfrac"] == pytest.approx(0.5)


def test_clip_cov_detaches_a_random_subset_of_the_requested_size():
    config = cov_config(loss_mode="clip_cov", clip_cov_ratio=0.25, clip_cov_lb=0.5, clip_cov_ub=5.0)
    seen = set()
    for seed in range(20):
        torch.manual_seed(seed)
        old, logp, a, m = inputs(ratio=[1.0] * 4, **COV_CASE)
        loss, metrics, _ = run("clip_cov", old, logp, a, m, config)
        # one of t0, t2 is detached: (0 - 1 + 1 + 2)/4 = 0.5 or (-2 - 1 + 0 + 2)/4 = -0.25
        assert metrics["pg_clipfrac"] == 0.25
        seen.add(round(loss, 6))
    assert seen == {0.5, -0.25}


def test_clip_cov_leaves_tokens_that_ppo_clipped_alone():
    config = cov_config(loss_mode="clip_cov", clip_cov_ratio=0.5, clip_cov_lb=0.5, clip_cov_ub=5.0)
    old, logp, a, m = inputs([-1.0, -3.0], ratio=[2.0, 1.0], advantages=[1, -1], mask=[1, 1])
    loss, metrics, _ = run("clip_cov", old, logp, a, m, config)
    # covariance 1 * 1 = 1 and -1 * -1 = 1: both in the window, but t0 is PPO-clipped (max(-2, -1.2) = -1.2),
    # so only t1 is detached: (-1.2 + 0) / 2
    assert loss == pytest.approx(-0.6) and metrics["pg_clipfrac"] == 0.5


def test_kl_cov_penalises_the_top_covariance_tokens():
    config = cov_config(loss_mode="kl_cov", kl_cov_ratio=0.25, ppo_kl_coef=0.5)
    old, logp, a, m = inputs(ratio=[math.exp(0.4), 1.0, 1.0, 1.0], **COV_CASE)
    loss, metrics, grad = run("kl_cov", old, logp, a, m, config)
    # floor(0.25 * 4) = 1 token, the largest covariance: t0 (2). losses -A*r: -2 e^0.4 = -2.983649 + 0.5*0.4,
    # -1, 1, 2 -> (-2.783649 + 2) / 4 = -0.195912
    assert loss == pytest.approx(-0.1959123, abs=1e-7)
    # gradient: t0 (-2 e^0.4 + 0.5 * sign(0.4)) / 4 = -0.620912; others -A/4
    assert grad == pytest.approx([-0.6209123, -0.25, 0.25, 0.5], abs=1e-7)
    assert metrics["pg_clipfrac"] == 0.25 and metrics["ppo_kl"] == pytest.approx(-0.1)


# the losses verlx ships (test helpers register planted faults beside them); bypass_mode: test_bypass_mode
SHIPPED_LOSSES = [name for name in shipped_names(POLICY_LOSSES) if name != "bypass_mode"]


@pytest.mark.parametrize("mode", SHIPPED_LOSSES)
def test_every_loss_returns_detached_zero_dim_metrics_and_honours_agg_kwargs(mode):
    config = cov_config(loss_mode=mode, dro_beta=0.1)
    old, logp, a, m = inputs([-1.0, -2.0], ratio=[1.0, 1.0], advantages=[1, 1], mask=[1, 1])
    loss, metrics = POLICY_LOSSES.get(mode)(old, logp, a, m, "token-mean", config, num_tokens=4, num_seqs=2)
    assert set(metrics) == {"pg_clipfrac", "pg_clipfrac_lower", "ppo_kl"}
    assert all(v.dim() == 0 and not v.requires_grad for v in metrics.values())
    assert loss.requires_grad and torch.isfinite(loss)
    # ratio 1, A 1: per-token loss -1, summed -2 over 4 given tokens = -0.5 (geo_mean: sequence loss -1 over 2 given
    # sequences = -0.5); gpg, cispo, dro and dppo weigh -A * log pi = 1, 2 -> 3 / 4; sapo's gate at r = 1 is
    # 2 / tau_pos = 2: token mean -2 over 2 given sequences = -1
    log_pi_modes = {"gpg", "cispo", "dro", "dppo_tv", "dppo_kl"}
    assert loss.item() == pytest.approx(0.75 if mode in log_pi_modes else {"sapo": -1.0}.get(mode, -0.5))


def test_unknown_policy_loss_lists_the_registered_ones():
    with pytest.raises(KeyError) as err:
        POLICY_LOSSES.get("vanila")
    message = str(err.value)
    assert "actor_rollout_ref.actor.policy_loss.loss_mode" in message
    assert ("bypass_mode, cispo, clip_cov, dppo_kl, dppo_tv, dro, geo_mean, gpg, gspo, kl_cov, sapo, vanilla" in message
            and "Did you mean 'vanilla'" in message)
