"""Advantage estimators against hand-worked examples, the registry flags and compute_advantage on a DataProto."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers.registries import shipped_names
from verlx.algorithms import advantages as adv
from verlx.algorithms.advantages import (
    ADV_ESTIMATORS,
    compute_advantage,
    estimator_needs_critic,
    estimator_needs_greedy_baseline,
    estimator_needs_groups,
    uses_critic,
)
from verlx.config.loader import build, load_yaml, to_container
from verlx.config.roles import CriticConfig
from verlx.config.run import AlgorithmConfig
from verlx.config.schema import PPOConfig
from verlx.protocol import DataProto

# Six samples in three groups, deliberately interleaved: a = rows 0, 2, 5; b = rows 1, 4; c = row 3 (alone).
UIDS = np.array(["a", "b", "a", "c", "b", "a"], dtype=object)
SCORES = [1.0, 2.0, 0.0, 3.0, 2.0, 0.5]
LENGTHS = [2, 1, 4, 3, 2, 1]
R = 4


def outcome_batch(scores=SCORES, lengths=LENGTHS):
    """Outcome rewards: each sample's score sits on its last response token."""
    mask = (torch.arange(R)[None, :] < torch.tensor(lengths)[:, None]).float()
    rewards = torch.zeros(len(scores), R)
    rewards[torch.arange(len(scores)), torch.tensor(lengths) - 1] = torch.tensor(scores)
    return rewards, mask


def per_sample(advantages, mask):
    """The scalar an outcome estimator spread over the response, after checking it is constant there and 0 outside."""
    first = advantages[:, 0]
    torch.testing.assert_close(advantages, first[:, None] * mask)
    return first.tolist()


def test_grpo_with_std_normalisation():
    rewards, mask = outcome_batch()
    a, returns = adv.grpo(rewards, mask, UIDS)
    # group a: scores 1, 0, 0.5 -> mean 0.5, unbiased std sqrt((0.25 + 0.25 + 0) / 2) = 0.5
    #   -> (1 - 0.5)/0.5 = 1, (0 - 0.5)/0.5 = -1, 0 (eps = 1e-6 shifts these by 2e-6)
    # group b: 2, 2 -> std 0 -> 0 / (0 + eps) = 0; group c: one sample -> 0
    assert per_sample(a, mask) == pytest.approx([1.0, 0.0, -1.0, 0.0, 0.0, 0.0], abs=1e-5)
    torch.testing.assert_close(returns, a)


def test_grpo_without_std_normalisation_is_dr_grpo():
    rewards, mask = outcome_batch()
    a, _ = adv.grpo(rewards, mask, UIDS, norm_adv_by_std_in_grpo=False)
    # s - mean_g: a: 1 - 0.5, 0 - 0.5, 0.5 - 0.5; b: 0, 0; c: alone -> 0
    assert per_sample(a, mask) == pytest.approx([0.5, 0.0, -0.5, 0.0, 0.0, 0.0])


def test_grpo_passk():
    rewards, mask = outcome_batch()
    a, _ = adv.grpo_passk(rewards, mask, UIDS, norm_adv_by_std_in_grpo=False)
    # a: best is row 0 (1.0), runner-up 0.5 -> 0.5 for row 0 only; b: tie 2, 2 -> best row 1 gets 2 - 2 = 0
    assert per_sample(a, mask) == pytest.approx([0.5, 0.0, 0.0, 0.0, 0.0, 0.0])
    a, _ = adv.grpo_passk(rewards, mask, UIDS)
    # divided by group a's std 0.5: 1.0
    assert per_sample(a, mask) == pytest.approx([1.0, 0.0, 0.0, 0.0, 0.0, 0.0], abs=1e-5)


def test_grpo_passk_ties_at_the_top_go_to_the_first_row():
    rewards, mask = outcome_batch(scores=[1.0, 1.0, 0.0], lengths=[1, 1, 1])
    a, _ = adv.grpo_passk(rewards, mask, np.array([7, 7, 7]), norm_adv_by_std_in_grpo=False)
    assert per_sample(a, mask) == [0.0, 0.0, 0.0]  # best 1.0 (row 0), runner-up 1.0 -> 0
    rewards, mask = outcome_batch(scores=[0.0, 1.0, 0.0], lengths=[1, 1, 1])
    a, _ = adv.grpo_passk(rewards, mask, np.array([7, 7, 7]), norm_adv_by_std_in_grpo=False)
    assert per_sample(a, mask) == [0.0, 1.0, 0.0]  # best row 1: 1 - 0


# GDPO components of the six samples: a = rows 0, 2, 5; b = rows 1, 4; c = row 3
GDPO_COMPONENTS = {"fmt": [1.0, 1.0, 0.0, 1.0, 0.0, 1.0], "acc": [2.0, 0.0, 0.0, 5.0, 1.0, 1.0]}


def test_gdpo_normalises_each_component_in_its_group_then_whitens_the_weighted_sum():
    _, mask = outcome_batch()
    components = {k: torch.tensor(v) for k, v in GDPO_COMPONENTS.items()}
    a, returns = adv.gdpo(mask, UIDS, components, gdpo_reward_weights=[1.0, 0.5])
    # fmt in a: 1, 0, 1 -> mean 2/3, std sqrt(1/3) -> 0.5773503, -1.1547005, 0.5773503; in b: 1, 0 -> +-0.7071068
    # acc in a: 2, 0, 1 -> mean 1, std 1 -> 1, -1, 0; in b: 0, 1 -> -+0.7071068; c alone -> 0
    # fmt + 0.5 acc per row: 1.0773503, 0.3535534, -1.6547005, 0, -0.3535534, 0.5773503, then whitened over the
    # 13 response tokens (lengths 2, 1, 4, 3, 2, 1): mean -0.3261773, unbiased variance 1.0498954
    expected = [1.3697709, 0.6633823, -1.2965705, 0.3183323, -0.0267177, 0.8817965]
    assert per_sample(a, mask) == pytest.approx(expected, abs=1e-6)
    torch.testing.assert_close(returns, a)


def test_gdpo_reads_the_reward_columns_and_names_a_missing_one():
    rewards, mask = outcome_batch()
    data = DataProto({"token_level_rewards": rewards, "response_mask": mask},
                     non_tensor_batch={"uid": UIDS, **{k: np.array(v) for k, v in GDPO_COMPONENTS.items()}})
    config = AlgorithmConfig(adv_estimator="gdpo", gdpo_reward_keys=["fmt", "acc"], gdpo_reward_weights=[1.0, 0.5])
    a = compute_advantage(data, config).batch["advantages"]
    assert per_sample(a, mask)[0] == pytest.approx(1.3697709, abs=1e-6)
    config.gdpo_reward_keys = ["fmt", "accuracy"]
    with pytest.raises(ValueError, match=r"names 'accuracy', which the reward function did not return; its columns: "
                                         r"\['acc', 'fmt', 'uid'\]"):
        compute_advantage(data, config)


@pytest.mark.parametrize("overrides,message", [
    ([], "needs algorithm.gdpo_reward_keys"),
    (["algorithm.gdpo_reward_keys=[a,b]", "algorithm.gdpo_reward_weights=[1]"], "has 1 entries for 2"),
])
def test_gdpo_config_problems(overrides, message):
    cfg = build(PPOConfig, to_container(load_yaml(overrides=["algorithm.adv_estimator=gdpo", *overrides])))
    problems = adv.estimator_problems(cfg)
    assert len(problems) == 1 and message in problems[0], problems


def test_rloo():
    rewards, mask = outcome_batch()
    a, _ = adv.rloo(rewards, mask, UIDS)
    # a: s_i - mean(others): 1 - (0 + 0.5)/2 = 0.75, 0 - (1 + 0.5)/2 = -0.75, 0.5 - (1 + 0)/2 = 0; b: 0; c: alone 0
    assert per_sample(a, mask) == pytest.approx([0.75, 0.0, -0.75, 0.0, 0.0, 0.0])


def test_opo_length_weighted_baseline():
    rewards, mask = outcome_batch()
    a, _ = adv.opo(rewards, mask, UIDS)
    # a: lengths 2, 4, 1 -> baseline (2*1 + 4*0 + 1*0.5) / 7 = 2.5/7
    #    -> 1 - 2.5/7 = 4.5/7, 0 - 2.5/7, 0.5 - 2.5/7 = 1/7; b: (1*2 + 2*2)/3 = 2 -> 0; c: alone 0
    assert per_sample(a, mask) == pytest.approx([4.5 / 7, 0.0, -2.5 / 7, 0.0, 0.0, 1 / 7])


def test_gpg():
    rewards, mask = outcome_batch()
    a, _ = adv.gpg(rewards, mask, UIDS)
    # alpha = B / #nonzero scores = 6 / 5 = 1.2 (row 2 scores 0); a: 1.2 * (0.5, -0.5, 0); b: 0; c: alone 0
    assert per_sample(a, mask) == pytest.approx([0.6, 0.0, -0.6, 0.0, 0.0, 0.0])


def test_reinforce_plus_plus_baseline():
    rewards, mask = outcome_batch()
    a, returns = adv.reinforce_plus_plus_baseline(rewards, mask, UIDS)
    # s - mean_g per sample: 0.5, 0, -0.5, 0 (alone), 0, 0 on 2, 1, 4, 3, 2, 1 tokens = 13 tokens:
    # token values: 0.5 x2, -0.5 x4, 0 x7 -> mean (1 - 2)/13 = -1/13
    # unbiased var = (sum x^2 - 13 mean^2) / 12 = (0.5 + 1 - 1/13) / 12 = (18.5/13) / 12
    # std = sqrt(0.118590) = 0.344369 -> 0.5 -> (0.5 + 1/13)/std = 1.675307, 0 -> 0.223374, -0.5 -> -1.228558
    expected = torch.tensor([1.675307, 0.223374, -1.228558, 0.223374, 0.223374, 0.223374])[:, None] * mask
    torch.testing.assert_close(a, expected, rtol=0, atol=2e-6)
    torch.testing.assert_close(returns, a)


def test_gae_with_a_hole_in_the_mask():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 9.0, 2.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [1.0, 9.0, 0.5]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 1]])  # row 1: token 1 is outside the response (e.g. tool output)
    a, returns = adv.gae(rewards, mask, values, gamma=0.9, lam=0.8)
    # row 0, gamma*lam = 0.72:
    #   d2 = 1 - 0.7 = 0.3, d1 = 0.9*0.7 - 0.6 = 0.03, d0 = 0.9*0.6 - 0.5 = 0.04
    #   A2 = 0.3, A1 = 0.03 + 0.72*0.3 = 0.246, A0 = 0.04 + 0.72*0.246 = 0.21712; returns A + V = 0.71712, 0.846, 1.0
    # row 1 skips token 1 (its reward 9 and value 9 are ignored):
    #   d2 = 2 - 0.5 = 1.5, d0 = 0.9*0.5 - 1.0 = -0.55 -> A0 = -0.55 + 0.72*1.5 = 0.53; returns 1.53, -, 2.0
    torch.testing.assert_close(returns, torch.tensor([[0.71712, 0.846, 1.0], [1.53, 0.0, 2.0]]))
    # whitened over the 5 valid tokens: mean 2.79312/5 = 0.558624, unbiased var 0.2920633 -> (A - mean)/std
    expected = torch.tensor([[-0.631913, -0.578474, -0.478553], [-0.052965, 0.0, 1.741906]])
    torch.testing.assert_close(a, expected, rtol=0, atol=2e-6)


def test_gae_over_many_blocks_with_gamma_lam_one_gives_reward_minus_value():
    # gamma = lam = 1, reward 1 at the last of 300 tokens: A_t = sum_k d_k = 1 - V_t (telescoping), return = 1
    length = 300
    rewards = torch.zeros(2, length)
    rewards[:, -1] = 1.0
    values = torch.linspace(0, 1, length).repeat(2, 1)
    _, returns = adv.gae(rewards, torch.ones(2, length), values, gamma=1.0, lam=1.0)
    torch.testing.assert_close(returns, torch.ones(2, length))


def test_reinforce_plus_plus_discounted_and_whitened():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 2.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    a, returns = adv.reinforce_plus_plus(rewards, mask, gamma=0.5)
    # returns: row 0: 0.25, 0.5, 1; row 1: 1, 2
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0, 0.0], [1.0, 2.0, 0.0, 0.0]]))
    # whitened: mean 4.75/5 = 0.95, deviations -0.7 -0.45 0.05 | 0.05 1.05, unbiased var 1.8/4 = 0.45
    expected = torch.tensor([[-1.043498, -0.670820, 0.074536, 0.0], [0.074536, 1.565248, 0.0, 0.0]])
    torch.testing.assert_close(a, expected, rtol=0, atol=2e-6)


def test_reinforce_plus_plus_skips_tokens_outside_the_mask():
    rewards = torch.tensor([[0.0, 5.0, 1.0]])
    _, returns = adv.reinforce_plus_plus(rewards, torch.tensor([[1, 0, 1]]), gamma=0.5)
    assert returns.tolist() == [[0.5, 0.0, 1.0]]  # 0 + 0.5 * 1; the masked reward 5 is ignored


def test_remax():
    rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 3.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]])
    a, returns = adv.remax(rewards, mask, torch.tensor([0.4, 3.5]))
    # returns = reward-to-go (undiscounted): 1, 1, 1 | 3, 3; advantages = returns - greedy baseline
    assert returns.tolist() == [[1.0, 1.0, 1.0, 0.0], [3.0, 3.0, 0.0, 0.0]]
    torch.testing.assert_close(a, torch.tensor([[0.6, 0.6, 0.6, 0.0], [-0.5, -0.5, 0.0, 0.0]]))


# the estimators verlx ships (test helpers register planted faults beside them: tests/helpers/learning_faults.py)
SHIPPED = shipped_names(ADV_ESTIMATORS, lambda estimator: estimator.fn)


@pytest.mark.parametrize("name", [n for n in SHIPPED if estimator_needs_groups(n)
                                  and not ADV_ESTIMATORS.get(n).needs_sum_pi_squared])
def test_groups_of_one_give_zero_not_nan(name):
    # (the optimal token baseline gives A = G to a group of one, as veRL: tests/unit/test_token_baseline.py)
    rewards, mask = outcome_batch(scores=[1.0, 0.0, 3.0], lengths=[1, 2, 3])
    a, returns = ADV_ESTIMATORS.get(name)(token_level_rewards=rewards, response_mask=mask,
                                          index=np.array(["x", "y", "z"], dtype=object),
                                          reward_components={"score": rewards.sum(-1)})
    assert torch.equal(a, torch.zeros_like(a)) and torch.isfinite(returns).all()


def test_registry_flags():
    assert estimator_needs_critic("gae") and not estimator_needs_critic("grpo")
    assert {n for n in SHIPPED if estimator_needs_groups(n)} == {
        "grpo", "grpo_passk", "gdpo", "rloo", "opo", "gpg", "reinforce_plus_plus_baseline", "optimal_token_baseline",
        "tir_optimal_token_baseline"}
    assert [n for n in SHIPPED if estimator_needs_greedy_baseline(n)] == ["remax"]
    assert [n for n in SHIPPED if ADV_ESTIMATORS.get(n).needs_sum_pi_squared] == [
        "optimal_token_baseline", "tir_optimal_token_baseline"]
    assert set(SHIPPED) == {"gae", "grpo", "grpo_passk", "gdpo", "rloo", "reinforce_plus_plus",
                                   "reinforce_plus_plus_baseline", "remax", "opo", "gpg", "optimal_token_baseline",
                                   "tir_optimal_token_baseline"}


@pytest.mark.parametrize("fn", [estimator_needs_critic, estimator_needs_groups, estimator_needs_greedy_baseline])
def test_unknown_estimator_lists_the_registered_ones(fn):
    with pytest.raises(KeyError) as err:
        fn("grp0")
    message = str(err.value)
    assert "algorithm.adv_estimator" in message and "gae, gdpo, gpg, grpo" in message
    assert "Did you mean 'grpo'" in message


@pytest.mark.parametrize(("estimator", "enable", "expected"), [
    ("gae", None, True), ("grpo", None, False), ("grpo", True, True), ("gae", False, False)])
def test_uses_critic_follows_critic_enable_else_the_estimator(estimator, enable, expected):
    config = PPOConfig(algorithm=AlgorithmConfig(adv_estimator=estimator), critic=CriticConfig(enable=enable))
    assert uses_critic(config) is expected


def test_uses_critic_of_an_unknown_estimator_names_the_key():
    with pytest.raises(KeyError, match="algorithm.adv_estimator"):
        uses_critic(PPOConfig(algorithm=AlgorithmConfig(adv_estimator="grp0")))


def test_compute_advantage_on_a_dataproto():
    rewards, mask = outcome_batch()
    data = DataProto({"token_level_rewards": rewards, "response_mask": mask}, {"uid": UIDS})
    out = compute_advantage(data, AlgorithmConfig(adv_estimator="rloo"))
    assert out is data
    assert per_sample(data.batch["advantages"], mask) == pytest.approx([0.75, 0.0, -0.75, 0.0, 0.0, 0.0])
    torch.testing.assert_close(data.batch["returns"], data.batch["advantages"])


def test_compute_advantage_passes_gamma_and_lam():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    data = DataProto({"token_level_rewards": rewards, "response_mask": torch.ones(1, 3), "values": torch.zeros(1, 3)})
    compute_advantage(data, AlgorithmConfig(adv_estimator="gae", gamma=0.5, lam=0.5))
    # V = 0: deltas 0, 0, 1; gamma*lam = 0.25 -> A = 0.0625, 0.25, 1 = returns
    assert data.batch["returns"].tolist() == [[0.0625, 0.25, 1.0]]


@pytest.mark.parametrize(
    "estimator,drop,needle",
    [("gae", "values", "batch key 'values'"), ("grpo", "uid", "non_tensor_batch key 'uid'"),
     ("remax", "reward_baselines", "batch key 'reward_baselines'")],
)
def test_compute_advantage_names_the_missing_input(estimator, drop, needle):
    rewards, mask = outcome_batch()
    tensors = {"token_level_rewards": rewards, "response_mask": mask, "values": torch.zeros_like(rewards),
               "reward_baselines": torch.zeros(6)}
    non_tensors = {"uid": UIDS}
    tensors.pop(drop, None)
    non_tensors.pop(drop, None)
    with pytest.raises(ValueError, match=f"adv_estimator={estimator} needs {needle}"):
        compute_advantage(DataProto(tensors, non_tensors), AlgorithmConfig(adv_estimator=estimator))


def test_group_estimators_accept_integer_labels_and_large_batches():
    groups, n = 2048, 4
    scores = torch.arange(groups * n, dtype=torch.float32) % n  # 0, 1, 2, 3 in every group
    rewards = torch.stack([scores, torch.zeros_like(scores)], dim=1)
    mask = torch.tensor([[1.0, 0.0]]).repeat(groups * n, 1)
    a, _ = adv.grpo(rewards, mask, np.repeat(np.arange(groups), n), norm_adv_by_std_in_grpo=False)
    # mean of 0..3 is 1.5 -> -1.5, -0.5, 0.5, 1.5 in every group
    assert a[:4, 0].tolist() == [-1.5, -0.5, 0.5, 1.5] and torch.equal(a[-4:], a[:4])
