"""The optimal token baseline estimators (optimal_token_baseline, tir_optimal_token_baseline) against hand-worked
groups, and their wiring through compute_advantage."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from verlx.algorithms.advantages import ADV_ESTIMATORS, compute_advantage, estimator_problems, needs_sum_pi_squared
from verlx.algorithms.token_baseline import optimal_token_baseline, tir_optimal_token_baseline
from verlx.config.loader import build, load_yaml, to_container
from verlx.config.run import AlgorithmConfig
from verlx.config.schema import PPOConfig
from verlx.protocol import DataProto

HALF = math.log(0.5)  # with pi = 0.5 the per-token weight 1 - 2 pi + sum pi^2 is sum pi^2 itself


def rows(lengths, rewards_at_end, weights, r=4):
    """Right-padded responses: reward on the last valid token, per-token weights w (as sum_pi_squared, pi = 0.5)."""
    b = len(lengths)
    mask = (torch.arange(r)[None, :] < torch.tensor(lengths)[:, None]).double()
    rewards = torch.zeros(b, r, dtype=torch.float64)
    rewards[torch.arange(b), torch.tensor(lengths) - 1] = torch.tensor(rewards_at_end, dtype=torch.float64)
    spsq = torch.tensor([w + [0.0] * (r - len(w)) for w in weights], dtype=torch.float64)
    return rewards, mask, torch.full((b, r), HALF, dtype=torch.float64), spsq


# group g: lengths 2, 4, 3 (the 4 is the unique longest); group s: one response; group t: a tie of two
LENGTHS = [2, 4, 3, 2, 2, 2]
REWARDS = [1.0, 3.0, 0.0, 5.0, 1.0, 0.0]
WEIGHTS = [[0.5, 0.5], [0.5, 1.0, 0.5, 0.5], [1.0, 1.0, 1.0], [1.0, 1.0], [1.0, 1.0], [1.0, 1.0]]
UIDS = np.array(["g", "g", "g", "s", "t", "t"], dtype=object)


def test_optimal_token_baseline_hand_worked():
    rewards, mask, old, spsq = rows(LENGTHS, REWARDS, WEIGHTS)
    adv, returns = optimal_token_baseline(rewards, mask, UIDS, old, spsq)
    # group g: G = [1, 1], [3, 3, 3, 3], [0, 0, 0]; W = cumulative weights [0.5, 1], [0.5, 1.5, 2, 2.5], [1, 2, 3]
    #   B_0 = (1*0.5 + 3*0.5 + 0*1) / (0.5 + 0.5 + 1) = 1;  B_1 = (1*1 + 3*1.5 + 0*2) / (1 + 1.5 + 2) = 5.5/4.5
    #   B_2 = (3*2 + 0*3) / (2 + 3) = 1.2;  t = 3: only the longest response, past the second longest -> B = 0
    b1 = 5.5 / 4.5
    expected = [[1 - 1, 1 - b1, 0, 0], [3 - 1, 3 - b1, 3 - 1.2, 3.0], [0 - 1, 0 - b1, 0 - 1.2, 0]]
    # group s: one response, no baseline: A = G = 5; group t: tie for longest (no lone tail), equal W:
    #   B = (1 W + 0 W) / 2W = 0.5 -> +0.5 and -0.5
    expected += [[5.0, 5.0, 0, 0], [0.5, 0.5, 0, 0], [-0.5, -0.5, 0, 0]]
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float64), rtol=0, atol=1e-7)
    torch.testing.assert_close(returns[1], torch.tensor([3.0, 3.0, 3.0, 3.0], dtype=torch.float64))
    assert torch.equal(returns * (1 - mask), torch.zeros_like(returns))


def test_rollout_is_weights_scale_the_token_weights_by_their_square():
    rewards, mask, old, spsq = rows(LENGTHS[:3], REWARDS[:3], WEIGHTS[:3])
    rho = torch.ones_like(mask)
    rho[2] = 2.0  # response 2's weights x 4: W = [4, 8, 12]
    adv, _ = optimal_token_baseline(rewards, mask, UIDS[:3], old, spsq, rollout_is_weights=rho)
    # B_0 = (0.5 + 1.5 + 0) / (0.5 + 0.5 + 4) = 0.4 -> A = 1 - 0.4 for response 0
    assert adv[0, 0].item() == pytest.approx(0.6, abs=1e-7)


def test_the_weight_is_one_minus_two_pi_plus_sum_pi_squared():
    rewards, mask, _, _ = rows([1, 1], [1.0, 0.0], [[0.0], [0.0]])
    old = torch.log(torch.tensor([[0.25, 0, 0, 0], [0.5, 0, 0, 0]], dtype=torch.float64) + 1e-300)
    spsq = torch.tensor([[0.5, 0, 0, 0], [0.75, 0, 0, 0]], dtype=torch.float64)
    adv, _ = optimal_token_baseline(rewards, mask, np.array(["a", "a"], dtype=object), old, spsq)
    # w = 1 - 0.5 + 0.5 = 1 and 1 - 1 + 0.75 = 0.75: B = (1 * 1 + 0) / 1.75
    assert adv[0, 0].item() == pytest.approx(1 - 1 / 1.75, abs=1e-7)


def tool_rows():
    # response 0 has tool output at position 1 (outside the mask); both have 3 valid tokens, w = 1 everywhere
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 0]], dtype=torch.float64)
    rewards = torch.tensor([[0, 0, 0, 2.0], [0, 0, 0, 0]], dtype=torch.float64)
    return rewards, mask, torch.full((2, 4), HALF, dtype=torch.float64), torch.ones(2, 4, dtype=torch.float64)


def test_tir_aligns_responses_by_valid_token_index():
    rewards, mask, old, spsq = tool_rows()
    adv, _ = tir_optimal_token_baseline(rewards, mask, np.array(["a", "a"], dtype=object), old, spsq)
    # by valid index: G = [2, 2, 2] and [0, 0, 0], W = [1, 2, 3] for both -> B = 1 at every index
    torch.testing.assert_close(adv, torch.tensor([[1.0, 0, 1.0, 1.0], [-1.0, -1.0, -1.0, 0]], dtype=torch.float64),
                               rtol=0, atol=1e-7)
    # the positional estimator compares position 2 of response 0 (its 2nd valid token, W = 2) with position 2 of
    # response 1 (its 3rd, W = 3): B_2 = 2*2 / (2 + 3) = 0.8; at position 1 only response 1 counts (B = 0), at 3
    # only response 0 (B = 2: lengths tie, so no lone tail)
    positional, _ = optimal_token_baseline(rewards, mask, np.array(["a", "a"], dtype=object), old, spsq)
    torch.testing.assert_close(positional, torch.tensor([[1.0, 0, 1.2, 0.0], [-1.0, 0.0, -0.8, 0]],
                                                        dtype=torch.float64), rtol=0, atol=1e-7)


def test_an_empty_response_leaves_its_peer_without_a_baseline():
    rewards, mask, old, spsq = tool_rows()
    mask[1] = 0  # response 1 is empty: response 0 has no peer at any index -> A = G
    adv, _ = tir_optimal_token_baseline(rewards, mask, np.array(["a", "a"], dtype=object), old, spsq)
    torch.testing.assert_close(adv[0], torch.tensor([2.0, 0, 2.0, 2.0], dtype=torch.float64))
    assert torch.equal(adv[1], torch.zeros(4, dtype=torch.float64))


def otb_batch(with_sum_pi_squared=True) -> DataProto:
    rewards, mask, old, spsq = rows(LENGTHS, REWARDS, WEIGHTS)
    tensors = {"token_level_rewards": rewards, "response_mask": mask, "old_log_probs": old}
    if with_sum_pi_squared:
        tensors["sum_pi_squared"] = spsq
    return DataProto(tensors, non_tensor_batch={"uid": UIDS})


@pytest.mark.parametrize("name", ["optimal_token_baseline", "tir_optimal_token_baseline"])
def test_compute_advantage_reads_the_batch_and_names_what_is_missing(name):
    data = compute_advantage(otb_batch(), AlgorithmConfig(adv_estimator=name))
    assert data.batch["advantages"][3].tolist() == [5.0, 5.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="needs batch key 'sum_pi_squared'"):
        compute_advantage(otb_batch(with_sum_pi_squared=False), AlgorithmConfig(adv_estimator=name))


def test_the_actor_computes_sum_pi_squared_for_these_estimators_or_when_asked():
    def cfg(*overrides):
        return build(PPOConfig, to_container(load_yaml(overrides=list(overrides))))

    assert needs_sum_pi_squared(cfg("algorithm.adv_estimator=tir_optimal_token_baseline"))
    assert needs_sum_pi_squared(cfg("algorithm.adv_estimator=grpo",
                                    "actor_rollout_ref.actor.calculate_sum_pi_squared=true"))
    assert not needs_sum_pi_squared(cfg("algorithm.adv_estimator=grpo"))
    assert ADV_ESTIMATORS.get("optimal_token_baseline").needs_groups
    problems = estimator_problems(cfg("algorithm.adv_estimator=optimal_token_baseline",
                                      "algorithm.rollout_correction.bypass_mode=true"))
    assert len(problems) == 1 and "bypass_mode=true skips" in problems[0]
