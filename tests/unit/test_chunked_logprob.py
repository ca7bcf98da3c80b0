"""Chunked log-probs equal the full-logits computation in value and gradient, without full logits in memory."""

from __future__ import annotations

import pytest
import torch

from verlx.models.chunked_logprob import chunked_log_probs, chunked_sum_pi_squared, full_logits_log_probs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_values_and_gradients_match_full_logits(temperature, chunk):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 7, 16, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (3, 7), generator=g)
    w_lp = torch.randn(3, 7, generator=g, dtype=torch.float64)
    w_ent = torch.randn(3, 7, generator=g, dtype=torch.float64)

    lp, ent = chunked_log_probs(hidden, weight, targets, temperature, chunk, with_entropy=True)
    ref_lp, ref_ent = full_logits_log_probs(hidden, weight, targets, temperature, with_entropy=True)
    torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-10)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-10)

    gh, gw = torch.autograd.grad((lp * w_lp).sum() + (ent * w_ent).sum(), (hidden, weight))
    rh, rw = torch.autograd.grad((ref_lp * w_lp).sum() + (ref_ent * w_ent).sum(), (hidden, weight))
    torch.testing.assert_close(gh, rh, rtol=0, atol=1e-10)
    torch.testing.assert_close(gw, rw, rtol=0, atol=1e-10)


def test_hand_computed_two_token_vocab():
    # h = [1, 0], W = [[1,0],[0,1]] → logits [1, 0]; log p(0) = 1 - log(e + 1) = -0.31326169
    hidden = torch.tensor([[1.0, 0.0]])
    weight = torch.eye(2)
    lp, ent = chunked_log_probs(hidden, weight, torch.tensor([0]), with_entropy=True)
    assert lp.item() == pytest.approx(-0.31326169, abs=1e-6)
    # p = [0.7310586, 0.2689414]; H = -(p0 log p0 + p1 log p1) = 0.58220309
    assert ent.item() == pytest.approx(0.58220309, abs=1e-6)


def test_gradient_without_entropy_and_no_weight_grad():
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(10, 8, generator=g, requires_grad=True)
    weight = torch.randn(20, 8, generator=g)
    targets = torch.randint(0, 20, (10,), generator=g)
    lp, ent = chunked_log_probs(hidden, weight, targets, chunk_size=3)
    assert ent is None
    (gh,) = torch.autograd.grad(lp.sum(), hidden)
    ref, _ = full_logits_log_probs(hidden, weight, targets)
    (rh,) = torch.autograd.grad(ref.sum(), hidden)
    torch.testing.assert_close(gh, rh, rtol=1e-4, atol=1e-5)


def test_chunked_full_kl_matches_dense_value_and_gradient():
    from verlx.algorithms.kl import full_kl_from_logits
    from verlx.models.chunked_logprob import chunked_full_kl

    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(30, 8, generator=g, dtype=torch.float64, requires_grad=True)
    h_ref, w_ref = torch.randn(2, 5, 8, generator=g, dtype=torch.float64), torch.randn(30, 8, generator=g,
                                                                                      dtype=torch.float64)
    kl = chunked_full_kl(h, w, h_ref, w_ref, temperature=0.8, chunk_size=3)
    dense = full_kl_from_logits(h @ w.t() / 0.8, h_ref @ w_ref.t() / 0.8)
    torch.testing.assert_close(kl, dense, rtol=0, atol=1e-12)
    assert bool((kl >= 0).all())
    weights = torch.randn(2, 5, generator=g, dtype=torch.float64)
    grads = torch.autograd.grad((kl * weights).sum(), (h, w))
    dense_grads = torch.autograd.grad((dense * weights).sum(), (h, w))
    for a, b in zip(grads, dense_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_sum_pi_squared_hand_computed_and_against_the_full_softmax():
    # logits (ln 3, 0): p = (0.75, 0.25) -> 0.625; at T = 2 the logits halve: p = (0.6339746, 0.3660254) -> 0.5358984
    hidden = torch.tensor([[torch.log(torch.tensor(3.0)).item(), 0.0]], dtype=torch.float64)
    assert chunked_sum_pi_squared(hidden, torch.eye(2, dtype=torch.float64)).item() == pytest.approx(0.625)
    assert chunked_sum_pi_squared(hidden, torch.eye(2, dtype=torch.float64), temperature=2.0).item() == \
        pytest.approx(0.5358984, abs=1e-7)
    g = torch.Generator().manual_seed(1)
    hidden = torch.randn(3, 7, 16, generator=g, dtype=torch.float64) * 4
    weight = torch.randn(50, 16, generator=g, dtype=torch.float64)
    reference = torch.softmax(hidden @ weight.t() / 0.7, dim=-1).square().sum(-1)
    torch.testing.assert_close(chunked_sum_pi_squared(hidden, weight, 0.7, chunk_size=4), reference, rtol=0,
                               atol=1e-12)
