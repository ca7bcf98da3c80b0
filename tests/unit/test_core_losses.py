"""Masked statistics, loss aggregation (incl. the micro-batch contract), value loss and entropy."""

from __future__ import annotations

import math

import pytest
import torch

from verlx.algorithms.core import (
    LOSS_AGG_MODES,
    agg_loss,
    agg_loss_counts,
    compute_value_loss,
    entropy_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from verlx.algorithms.returns import discounted_reverse_cumsum

NAN = float("nan")


def test_masked_sum_and_mean_ignore_values_outside_the_mask_even_nan():
    x = torch.tensor([[1.0, 2.0, NAN], [4.0, NAN, 6.0]])
    m = torch.tensor([[1, 1, 0], [1, 0, 1]])
    assert masked_sum(x, m).item() == 13.0  # 1 + 2 + 4 + 6
    assert masked_mean(x, m).item() == 3.25  # 13 / 4
    assert masked_mean(x, m, dim=-1).tolist() == [1.5, 5.0]  # (1+2)/2, (4+6)/2
    assert masked_mean(x, torch.zeros_like(m)).item() == 0.0  # empty selection: 0, not NaN


def test_masked_var_and_whiten():
    x = torch.tensor([1.0, 2.0, 3.0, 100.0])
    m = torch.tensor([1, 1, 1, 0])
    # mean 2; squared deviations 1, 0, 1 -> biased 2/3, unbiased 2/2 = 1
    assert masked_var(x, m, unbiased=False).item() == pytest.approx(2 / 3)
    assert masked_var(x, m).item() == pytest.approx(1.0)
    # (x - 2) / sqrt(1 + 1e-8) on the three valid entries
    assert masked_whiten(x, m)[:3].tolist() == pytest.approx([-1.0, 0.0, 1.0], abs=1e-6)
    assert masked_whiten(x, m, shift_mean=False)[:3].tolist() == pytest.approx([1.0, 2.0, 3.0], abs=1e-6)
    # one selected element: the unbiased variance is undefined -> 0, and whitening gives 0 instead of NaN
    one = torch.tensor([1, 0, 0, 0])
    assert masked_var(x, one).item() == 0.0
    assert masked_whiten(x, one)[0].item() == 0.0


LOSS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0], [9.0, 9.0, 9.0, 9.0]])
MASK = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]])


@pytest.mark.parametrize(
    "mode,kwargs,expected",
    [
        ("token-mean", {}, 29 / 6),  # (1+2 + 5+6+7+8) / 6 tokens
        ("seq-mean-token-sum", {}, 14.5),  # (3 + 26) / 2 non-empty sequences
        ("seq-mean-token-mean", {}, 4.0),  # (3/2 + 26/4) / 2 = (1.5 + 6.5) / 2
        ("seq-mean-token-sum-norm", {}, 3.625),  # (3/4 + 26/4) / 2, norm_length = R = 4
        ("seq-mean-token-sum-norm", {"norm_length": 10}, 1.45),  # (0.3 + 2.6) / 2
        ("token-mean", {"num_tokens": 10}, 2.9),  # 29 / 10
        ("seq-mean-token-sum", {"num_seqs": 4}, 7.25),  # 29 / 4
        ("token-sum", {}, 29.0),  # 1+2 + 5+6+7+8, no normalisation
        ("token-sum", {"num_tokens": 10, "num_seqs": 4, "dp_size": 4}, 116.0),  # counts ignored, x 4 ranks
    ],
)
def test_agg_loss_modes(mode, kwargs, expected):
    assert agg_loss(LOSS, MASK, mode, **kwargs).item() == pytest.approx(expected)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_without_valid_tokens_is_zero_not_nan(mode):
    loss = torch.full((2, 3), 5.0, requires_grad=True)
    out = agg_loss(loss, torch.zeros(2, 3), mode)
    out.backward()
    assert out.item() == 0.0 and torch.isfinite(loss.grad).all()


def test_agg_loss_rejects_unknown_mode():
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-sum"):
        agg_loss(LOSS, MASK, "seq-sum")


def _ragged_batch(seed: int, batch: int = 12, length: int = 7):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(batch, length, generator=g, dtype=torch.float64)
    lengths = torch.randint(0, length + 1, (batch,), generator=g)
    lengths[3] = 0  # at least one sequence with no valid token
    mask = (torch.arange(length)[None, :] < lengths[:, None]).to(torch.float64)
    return loss, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_sum_to_the_mini_batch_loss(mode):
    loss, mask = _ragged_batch(0)
    full = agg_loss(loss, mask, mode, norm_length=7)
    bounds = [(0, 5), (5, 9), (9, 12)]
    counts = [agg_loss_counts(mask[a:b]) for a, b in bounds]
    num_tokens = sum(c[0] for c in counts)
    num_seqs = sum(c[1] for c in counts)
    parts = [
        agg_loss(loss[a:b], mask[a:b], mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=7)
        for a, b in bounds
    ]
    assert sum(parts).item() == pytest.approx(full.item(), rel=1e-12)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_micro_batches_over_data_parallel_ranks_average_to_the_mini_batch_gradient(mode):
    """2 ranks x 2 micro-batches; each rank sums its micro-batch losses, gradients are averaged over ranks (FSDP)."""
    loss, mask = _ragged_batch(1, batch=8)
    loss.requires_grad_(True)
    agg_loss(loss, mask, mode, norm_length=7).backward()
    expected = loss.grad.clone()
    loss.grad = None
    dp = 2
    num_tokens, num_seqs = (c / dp for c in agg_loss_counts(mask))
    rank_rows = [[(0, 3), (3, 4)], [(4, 6), (6, 8)]]
    for rows in rank_rows:
        rank_loss = sum(
            agg_loss(loss[a:b], mask[a:b], mode, num_tokens=num_tokens, num_seqs=num_seqs, norm_length=7, dp_size=dp)
            for a, b in rows
        )
        (rank_loss / dp).backward()  # the all-reduce average of the two ranks' gradients
    torch.testing.assert_close(loss.grad, expected, rtol=1e-12, atol=1e-12)


def test_value_loss_hand_worked():
    # cliprange 0.2 around old values 0.5 -> [0.3, 0.7]
    vpreds = torch.tensor([[1.0, 2.0, 0.0, 50.0]])
    values = torch.tensor([[0.5, 0.5, 0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.0, 1.0, -50.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    # unclipped (v-R)^2: 1, 4, 1; clipped (clip(v)-R)^2: (0.7-2)^2=1.69, (0.7-0)^2=0.49, (0.3-1)^2=0.49
    # max: 1.69, 4, 1 -> mean 6.69/3 = 2.23 -> times 0.5 = 1.115; clipped term larger on token 0 only -> 1/3
    vf_loss, clipfrac = compute_value_loss(vpreds, returns, values, mask, 0.2, "token-mean")
    assert vf_loss.item() == pytest.approx(1.115)
    assert clipfrac.item() == pytest.approx(1 / 3)
    # seq-mean-token-sum with a given num_seqs: 0.5 * 6.69 / 2
    vf_loss, _ = compute_value_loss(vpreds, returns, values, mask, 0.2, "seq-mean-token-sum", num_seqs=2)
    assert vf_loss.item() == pytest.approx(1.6725)


def test_entropy_from_logits():
    logits = torch.tensor(
        [
            [0.0, 0.0, 0.0, 0.0],  # uniform over 4: ln 4
            [0.0, -math.inf, 0.0, -math.inf],  # two masked entries: ln 2
            [1000.0, 1000.0, 1000.0, 1000.0],  # huge logits: still ln 4
            [math.log(0.5), math.log(0.25), math.log(0.25), -math.inf],  # 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2
        ]
    )
    expected = [math.log(4), math.log(2), math.log(4), 1.5 * math.log(2)]
    assert entropy_from_logits(logits).tolist() == pytest.approx(expected, abs=1e-5)


def test_discounted_reverse_cumsum_matches_closed_forms_across_blocks():
    length = 200  # crosses three 64-token blocks
    t = torch.arange(length, dtype=torch.float64)
    ones = torch.ones(1, length, dtype=torch.float64)
    # sum_{k>=t} 0.9^(k-t) = (1 - 0.9^(R-t)) / (1 - 0.9)
    geometric = (1 - 0.9 ** (length - t)) / 0.1
    torch.testing.assert_close(discounted_reverse_cumsum(ones, 0.9)[0], geometric, rtol=1e-12, atol=1e-12)
    # a single reward at the end: 0.5^(R-1-t)
    last = torch.zeros(1, length, dtype=torch.float64)
    last[0, -1] = 1.0
    torch.testing.assert_close(discounted_reverse_cumsum(last, 0.5)[0], 0.5 ** (length - 1 - t))
    # discount 0 returns the input, discount 1 the plain reverse cumulative sum: R - t
    torch.testing.assert_close(discounted_reverse_cumsum(ones, 0.0)[0], ones[0])
    torch.testing.assert_close(discounted_reverse_cumsum(ones, 1.0)[0], length - t)
