"""veRL 0.9.1's geo_mean (GMPO), sapo, dppo_tv, dppo_kl and dro losses: values, metrics and gradients against
hand-worked examples (the helpers build old log-probs from the wanted ratios pi / pi_old)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.policy_loss_cases import inputs, run
from verlx.algorithms.policy_losses import POLICY_LOSSES, policy_loss_problems
from verlx.config.loader import build, load_yaml, to_container
from verlx.config.roles import ActorConfig, PolicyLossConfig
from verlx.config.schema import PPOConfig


def close(actual, expected):
    torch.testing.assert_close(torch.tensor(actual, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64),
                               rtol=0, atol=1e-7)


def geo_case():
    # row 0: A = +1, log ratios 0.2, 0.6, -0.6; row 1: A = -2, log ratios -0.5, 0.1, 0.7 and a masked 9
    return inputs([[-1.0] * 4, [-1.0] * 4],
                  ratio=[[math.exp(0.2), math.exp(0.6), math.exp(-0.6), 1.0],
                         [math.exp(-0.5), math.exp(0.1), math.exp(0.7), math.exp(9)]],
                  advantages=[[1, 1, 1, 0], [-2, -2, -2, -2]], mask=[[1, 1, 1, 0], [1, 1, 1, 0]])


def test_geo_mean_clips_log_ratios_on_the_side_that_helps_and_takes_the_geometric_mean():
    old, logp, a, m = geo_case()
    loss, metrics, grad = run("geo_mean", old, logp, a, m, ActorConfig(clip_ratio=0.4), agg="token-sum")
    # log ratios are clipped to [-0.4, 0.4] only where that lowers the objective (PPO's pessimism):
    #   row 0 (A > 0): min(lr, clip(lr)) = 0.2, 0.4, -0.6 -> ratio exp(0 / 3) = 1
    #   row 1 (A < 0): max(lr, clip(lr)) = -0.4, 0.1, 0.7 -> ratio exp(0.4 / 3) = 1.1426308
    # sequence advantages: the token means 1 and -2 -> losses -1 and +2.2852616; their mean over the two
    # sequences, whatever loss_agg_mode says (token-sum here)
    assert loss == pytest.approx(0.6426308, abs=1e-7)
    # gradient: -A_i ratio_i / |y_i| / 2 sequences on the tokens whose log ratio was kept, 0 on the clipped ones
    close(grad, [[-1 / 6, 0.0, -1 / 6, 0.0], [0.0, 0.3808769, 0.3808769, 0.0]])
    # 6 valid tokens: 0.6 and -0.6 lie outside with A > 0 (pg_clipfrac), -0.5 and 0.7 with A < 0 (the lower one)
    assert metrics["pg_clipfrac"] == pytest.approx(2 / 6) and metrics["pg_clipfrac_lower"] == pytest.approx(2 / 6)
    assert metrics["ppo_kl"] == pytest.approx(-(0.2 + 0.6 - 0.6 - 0.5 + 0.1 + 0.7) / 6)


def test_geo_mean_is_weights_enter_as_their_per_sequence_geometric_mean_and_num_seqs_is_honoured():
    old, logp, a, m = geo_case()
    weights = torch.tensor([[2.0, 0.5, 1.0, 7.0], [4.0, 2.0, 1.0, 9.0]], dtype=torch.float64)
    loss, _, _ = run("geo_mean", old, logp, a, m, ActorConfig(clip_ratio=0.4), weights=weights)
    # geometric means over the valid tokens: (2 * 0.5 * 1)^(1/3) = 1, (4 * 2 * 1)^(1/3) = 2 -> (-1 + 2 * 2.2852616) / 2
    assert loss == pytest.approx(1.7852616, abs=1e-7)
    old, logp, a, m = geo_case()
    loss, _, _ = run("geo_mean", old, logp, a, m, ActorConfig(clip_ratio=0.4), num_seqs=4)
    assert loss == pytest.approx(1.2852616 / 4, abs=1e-7)  # the two losses summed, over the mini-batch's 4 sequences


def test_sapo_soft_gate():
    config = ActorConfig(tau_pos=2.0, tau_neg=4.0)
    old, logp, a, m = inputs([[-1.0, -1.0], [-1.0, -1.0]], ratio=[[1.0, 1.5], [0.5, 2.0]],
                             advantages=[[1, 1], [-1, 0]], mask=[[1, 1], [1, 0]])
    loss, metrics, grad = run("sapo", old, logp, a, m, config, agg="token-mean")
    # gate f(r) = sigmoid(tau (r - 1)) * 4 / tau; loss -A f(r):
    #   A=+1 r=1 tau 2: 0.5 * 2 = 1 -> -1;  A=+1 r=1.5: sigmoid(1) * 2 = 1.4621172 -> -1.4621172
    #   A=-1 r=0.5 tau 4: sigmoid(-2) * 1 = 0.1192029 -> +0.1192029
    # seq-mean-token-mean whatever loss_agg_mode says: (-2.4621172 / 2 + 0.1192029 / 1) / 2 (token-mean: -0.7809714)
    assert loss == pytest.approx(-0.5559278, abs=1e-7)
    # d/dlogp = -A * 4 s (1 - s) * r, s = sigmoid(tau (r - 1)), then / tokens of the row / 2 sequences:
    #   -1 * 1 * 1 / 4 = -0.25;  -(4 * 0.7310586 * 0.2689414) * 1.5 / 4 = -0.2949179;  0.4199743 * 0.5 / 2 = 0.1049936
    close(grad, [[-0.25, -0.2949179], [0.1049936, 0.0]])
    assert metrics["pg_clipfrac"] == 0.0 and metrics["pg_clipfrac_lower"] == 0.0


def test_dppo_tv_masks_tokens_that_left_the_probability_trust_region():
    config = ActorConfig(clip_ratio=0.2, clip_ratio_low=0.3, clip_ratio_c=3.0)  # p - p_old in [-0.3, 0.2]
    # (p, p_old, A): (0.5, 0.4, +1) (0.8, 0.5, +1) (0.1, 0.35, -1) (0.4, 0.1, -2) (0.1, 0.45, -1)
    old, logp, a, m = inputs([math.log(p) for p in (0.5, 0.8, 0.1, 0.4, 0.1)],
                             ratio=[1.25, 1.6, 0.1 / 0.35, 4.0, 0.1 / 0.45], advantages=[1, 1, -1, -2, -1],
                             mask=[1] * 5)
    loss, metrics, grad = run("dppo_tv", old, logp, a, m, config)
    # p - p_old: 0.1 <= 0.2 kept; 0.3 > 0.2 (A > 0) dropped; -0.25 >= -0.3 (A < 0) kept; 0.3 (A < 0) kept;
    # -0.35 < -0.3 (A < 0) dropped
    # loss -A sg[min(r, 3)] log p: -1.25 ln 0.5 = 0.8664340; (0.1/0.35) ln 0.1 = -0.6578814; 2 * 3 * ln 0.4 =
    # -5.4977444 -> their sum over 5 tokens
    assert loss == pytest.approx(-1.0578384, abs=1e-7)
    assert grad == pytest.approx([-1.25 / 5, 0.0, (0.1 / 0.35) / 5, 6.0 / 5, 0.0])  # -A * truncated ratio / 5
    assert metrics["pg_clipfrac"] == pytest.approx(0.4) and metrics["pg_clipfrac_lower"] == pytest.approx(0.2)


def test_dppo_kl_masks_by_the_binary_kl_unless_the_token_moved_against_its_advantage():
    config = ActorConfig(clip_ratio=0.05, clip_ratio_c=3.0)
    # (p, p_old, A): (0.5, 0.4, +1) (0.8, 0.5, +1) (0.1, 0.5, +1) (0.1, 0.5, -1) (0.5, 0.1, -1)
    old, logp, a, m = inputs([math.log(p) for p in (0.5, 0.8, 0.1, 0.1, 0.5)], ratio=[1.25, 1.6, 0.2, 0.2, 5.0],
                             advantages=[1, 1, 1, -1, -1], mask=[1] * 5)
    loss, metrics, grad = run("dppo_kl", old, logp, a, m, config)
    # binary KL p_old ln(p_old/p) + (1-p_old) ln((1-p_old)/(1-p)): 0.0201355 (kept), 0.2231435 with p > p_old and
    # A > 0 (dropped), 0.5108256 but p < p_old with A > 0 (kept), 0.5108256 with p < p_old and A < 0 (dropped),
    # p > p_old with A < 0 (kept, ratio 5 truncated at 3)
    # loss: (-1.25 ln 0.5 - 0.2 ln 0.1 + 3 ln 0.5) / 5
    assert loss == pytest.approx(-0.1504981, abs=1e-7)
    assert grad == pytest.approx([-1.25 / 5, 0.0, -0.2 / 5, 0.0, 3.0 / 5])
    assert metrics["pg_clipfrac"] == pytest.approx(0.4) and metrics["pg_clipfrac_lower"] == pytest.approx(0.2)


def test_dro_quadratic_log_ratio_penalty():
    config = ActorConfig(policy_loss=PolicyLossConfig(loss_mode="dro", dro_beta=0.5))
    old, logp, a, m = inputs([-1.0, -0.5], ratio=[math.exp(0.2), math.exp(-0.4)], advantages=[1, -2], mask=[1, 1])
    loss, metrics, grad = run("dro", old, logp, a, m, config)
    # -(A log pi - beta/2 (log r)^2): -(-1 - 0.25 * 0.04) = 1.01; -(1 - 0.25 * 0.16) = -0.96 -> mean 0.025
    assert loss == pytest.approx(0.025)
    # gradient -(A - beta log r) / 2: -(1 - 0.1) / 2 = -0.45; -(-2 + 0.2) / 2 = 0.9
    assert grad == pytest.approx([-0.45, 0.9])
    assert metrics["ppo_kl"] == pytest.approx(0.1) and metrics["pg_clipfrac"] == 0.0


@pytest.mark.parametrize("beta", [None, 0.0])
def test_dro_needs_a_positive_beta_and_preflight_says_so(beta):
    config = ActorConfig(policy_loss=PolicyLossConfig(loss_mode="dro", dro_beta=beta))
    old, logp, a, m = inputs([-1.0], ratio=[1.0], advantages=[1], mask=[1])
    with pytest.raises(ValueError, match=f"policy_loss.dro_beta={beta} must be a positive number"):
        run("dro", old, logp, a, m, config)
    overrides = ["actor_rollout_ref.actor.policy_loss.loss_mode=dro"]
    if beta is not None:
        overrides.append(f"actor_rollout_ref.actor.policy_loss.dro_beta={beta}")
    problems = policy_loss_problems(build(PPOConfig, to_container(load_yaml(overrides=overrides))))
    assert len(problems) == 1 and "dro_beta" in problems[0]


def test_preflight_evaluates_the_configured_loss_once():
    ok = build(PPOConfig, to_container(load_yaml(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=sapo"])))
    assert policy_loss_problems(ok) == []
    cold = build(PPOConfig, to_container(load_yaml(overrides=["actor_rollout_ref.actor.policy_loss.loss_mode=sapo",
                                                              "actor_rollout_ref.actor.tau_neg=0"])))
    assert "tau_neg=0.0 must be > 0" in policy_loss_problems(cold)[0]
    bad = build(PPOConfig, to_container(load_yaml(overrides=["actor_rollout_ref.actor.clip_ratio_c=0.5"])))
    assert "clip_ratio_c=0.5 must be > 1" in policy_loss_problems(bad)[0]


def test_yaml_defaults_match_verl():
    actor = build(PPOConfig, {}).actor_rollout_ref.actor
    assert (actor.tau_pos, actor.tau_neg, actor.policy_loss.dro_beta) == (1.0, 1.05, None)
    assert POLICY_LOSSES.get("geo_mean") is not None
