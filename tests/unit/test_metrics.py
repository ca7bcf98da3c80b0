"""compute_data_metrics: veRL metric names and hand-computed values on a small batch."""

from __future__ import annotations

import pytest
import torch

from verlx.metrics.data import compute_data_metrics
from verlx.protocol import DataProto

X = 99.0  # a value outside the response mask: must not show up anywhere


def batch(with_values=True):
    prompt_mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1], [0, 0, 1, 1]])  # left padded: lengths 3, 4, 2 of P=4
    response_mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]])  # lengths 3, 1, 2 of R=3
    tensors = {
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
        "response_mask": response_mask,
        "responses": torch.zeros(3, 3, dtype=torch.long),
        "token_level_scores": torch.tensor([[0.0, 0.0, 1.0], [0.5, 0.0, 0.0], [0.0, 0.0, 0.0]]),
        "token_level_rewards": torch.tensor([[-0.1, 0.0, 1.0], [0.5, 0.0, 0.0], [0.0, -0.2, 0.0]]),
        "advantages": torch.tensor([[1.0, 2.0, 3.0], [4.0, X, X], [-1.0, 0.0, X]]),
        "returns": torch.tensor([[2.0, 2.0, 2.0], [1.0, X, X], [0.0, 4.0, X]]),
    }
    if with_values:
        tensors["values"] = torch.tensor([[1.0, 2.0, 2.0], [1.0, -X, -X], [1.0, 3.0, -X]])
    return DataProto(tensors)


def test_data_metrics_with_critic():
    m = compute_data_metrics(batch(), use_critic=True)
    expected = {
        # per-sample score sums 1, 0.5, 0; reward sums 0.9, 0.5, -0.2
        "critic/score/mean": 0.5, "critic/score/max": 1.0, "critic/score/min": 0.0,
        "critic/rewards/mean": 0.4, "critic/rewards/max": 0.9, "critic/rewards/min": -0.2,
        # valid advantages 1, 2, 3, 4, -1, 0 -> mean 9/6
        "critic/advantages/mean": 1.5, "critic/advantages/max": 4.0, "critic/advantages/min": -1.0,
        # valid returns 2, 2, 2, 1, 0, 4 -> mean 11/6
        "critic/returns/mean": 11 / 6, "critic/returns/max": 4.0, "critic/returns/min": 0.0,
        # valid values 1, 2, 2, 1, 1, 3 -> mean 10/6
        "critic/values/mean": 10 / 6, "critic/values/max": 3.0, "critic/values/min": 1.0,
        # returns - values = 1, 0, 0, 0, -1, 1: unbiased var 0.566667; var(returns) = 1.766667
        # -> 1 - 0.566667 / (1.766667 + 1e-5) = 0.679247
        "critic/vf_explained_var": 0.679247,
        # response lengths 3, 1, 2 (one of three at R = 3); prompt lengths 3, 4, 2 (one of three at P = 4)
        "response_length/mean": 2.0, "response_length/max": 3.0, "response_length/min": 1.0,
        "response_length/clip_ratio": 1 / 3,
        "response/aborted_ratio": 0.0,  # every sample has a response
        "response_length_non_aborted/mean": 2.0, "response_length_non_aborted/max": 3.0,
        "response_length_non_aborted/min": 1.0, "response_length_non_aborted/clip_ratio": 1 / 3,
        "prompt_length/mean": 3.0, "prompt_length/max": 4.0, "prompt_length/min": 2.0,
        "prompt_length/clip_ratio": 1 / 3,
    }
    assert set(m) == set(expected)
    for key, value in expected.items():
        assert m[key] == pytest.approx(value, abs=1e-6), key
        assert type(m[key]) is float, key


def test_data_metrics_without_critic_has_no_value_metrics():
    m = compute_data_metrics(batch(with_values=False), use_critic=False)
    assert not any(k.startswith("critic/values") or k == "critic/vf_explained_var" for k in m)
    assert m["critic/advantages/mean"] == pytest.approx(1.5)


def test_aborted_samples_leave_the_score_and_length_statistics():
    """A sample over_sample_rate cancelled has no response token (attention and response_mask zero): counted in
    response/aborted_ratio, left out of critic/score, critic/rewards and response_length_non_aborted (veRL)."""
    data = batch(with_values=False)
    b = data.batch
    b["attention_mask"][2, 4:] = 0
    b["response_mask"][2] = 0
    m = compute_data_metrics(data, use_critic=False)
    assert m["response/aborted_ratio"] == pytest.approx(1 / 3)
    # scores of the two kept samples: 1 and 0.5 (the aborted one's 0 is left out); rewards 0.9 and 0.5
    assert (m["critic/score/mean"], m["critic/score/max"], m["critic/score/min"]) == pytest.approx((0.75, 1.0, 0.5))
    assert (m["critic/rewards/mean"], m["critic/rewards/min"]) == pytest.approx((0.7, 0.5))
    # kept lengths 3 and 1 (one at R = 3); response_length counts all three samples, the aborted one as 0
    assert (m["response_length_non_aborted/mean"], m["response_length_non_aborted/min"]) == pytest.approx((2.0, 1.0))
    assert m["response_length_non_aborted/clip_ratio"] == pytest.approx(0.5)
    assert (m["response_length/mean"], m["response_length/min"]) == pytest.approx((4 / 3, 0.0))
