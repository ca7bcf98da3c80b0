"""The unbiased pass@k estimator 1 - C(n-c, k) / C(n, k) against hand-computed values, and the per-source summary."""

from __future__ import annotations

from math import comb

import numpy as np
import pytest

from verlx.trainer.eval_metrics import pass_at_k, pass_ks, summarise_source


@pytest.mark.parametrize(
    "n,c,k,expected",
    [
        (5, 2, 1, 2 / 5),  # pass@1 is the fraction correct
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 2, 3, 1 - 1 / 10),  # 1 - C(3,3)/C(5,3) = 1 - 1/10
        (5, 2, 4, 1.0),  # n - c = 3 < k = 4: every draw of 4 holds a correct one
        (4, 1, 2, 1 - 3 / 6),  # 1 - C(3,2)/C(4,2)
        (4, 0, 4, 0.0),  # nothing correct
        (4, 4, 1, 1.0),  # everything correct
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5) = 1 - 21/252
    ],
)
def test_hand_computed_values(n, c, k, expected):
    assert pass_at_k(n, c, k)[0] == pytest.approx(expected, abs=1e-12)


def test_vectorised_over_prompts_with_different_n_matches_binomials():
    n = np.array([3, 8, 8, 16, 16])
    c = np.array([1, 0, 5, 2, 16])
    for k in (1, 2, 3):
        expected = [1 - comb(int(ni - ci), k) / comb(int(ni), k) for ni, ci in zip(n, c)]
        np.testing.assert_allclose(pass_at_k(n, c, k), expected, atol=1e-12)


def test_large_n_stays_finite_and_exact():
    # C(1000, 500) overflows a float; the product form does not: 1 - C(990,500)/C(1000,500) with c = 10
    expected = 1 - np.prod([(1000 - 500 - j) / (1000 - j) for j in range(10)])
    assert pass_at_k(1000, 10, 500)[0] == pytest.approx(expected, rel=1e-12)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="pass@3 needs at least 3 samples"):
        pass_at_k(2, 1, 3)
    with pytest.raises(ValueError, match="within \\[0, n\\]"):
        pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_at_k(4, 1, 0)


def test_reported_ks():
    assert pass_ks(1) == [1]
    assert pass_ks(2) == [1, 2]
    assert pass_ks(5) == [1, 2, 4, 5]
    assert pass_ks(8) == [1, 2, 4, 8]
    assert pass_ks(12) == [1, 2, 4, 8, 12]


def test_summary_of_one_source():
    scores = np.array([[1.0, 0.5, 0.0, 0.0],   # 1 correct (0.5 is below the threshold)
                       [1.0, 1.0, 0.5, 1.0]])  # 3 correct
    report = summarise_source(scores, pass_threshold=1.0)
    assert report["prompts"] == 2 and report["n"] == 4
    assert report["pass@1"] == pytest.approx((1 / 4 + 3 / 4) / 2)
    assert report["pass@2"] == pytest.approx(((1 - 3 / 6) + 1.0) / 2)  # row 0: 1 - C(3,2)/C(4,2); row 1: n-c < k
    assert report["pass@4"] == pytest.approx(1.0)
    assert report["mean@4"] == pytest.approx(5 / 8)  # (1 + .5 + 0 + 0 + 1 + 1 + .5 + 1) / 8
    assert summarise_source(scores, pass_threshold=0.5)["pass@1"] == pytest.approx((2 / 4 + 4 / 4) / 2)
