"""veRL's forward_kl_topk from hidden states, a chunk at a time, against the loss written out on full logits."""

from __future__ import annotations

import torch

from verlx.models.topk_distillation import chunked_topk_forward_kl, chunked_topk_log_probs


def _inputs(tokens=7, hidden=6, vocab=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, tokens, hidden, generator=g, dtype=torch.float64),
            torch.randn(vocab, hidden, generator=g, dtype=torch.float64),
            torch.randn(vocab, hidden, generator=g, dtype=torch.float64))


def test_the_teachers_top_k_are_its_largest_log_probs_in_order():
    h, _, w_teacher = _inputs()
    ids, lps = chunked_topk_log_probs(h, w_teacher, k=3, temperature=2.0, chunk_size=4)
    full = torch.log_softmax(h @ w_teacher.t() / 2.0, dim=-1)
    expected = torch.topk(full, 3, dim=-1)
    assert ids.shape == lps.shape == (2, 7, 3) and ids.dtype == torch.long and lps.dtype == torch.float32
    assert torch.equal(ids, expected.indices)
    torch.testing.assert_close(lps, expected.values.float())


def test_the_loss_and_its_gradient_match_the_full_logits_formula():
    """Σ_k p_t (log p_t − log p_s) over the teacher's k tokens, both clamped below at -2 (some are): value, the
    student's mass on those tokens, and the gradients in hidden states and weight."""
    h, w, w_teacher = _inputs()
    ids, lps = chunked_topk_log_probs(h, w_teacher, k=4, chunk_size=5)
    lps = lps.double()
    h1, w1 = h.clone().requires_grad_(), w.clone().requires_grad_()
    kl, mass = chunked_topk_forward_kl(h1, w1, ids, lps, chunk_size=3, log_prob_min_clamp=-2.0)
    kl.sum().backward()
    h2, w2 = h.clone().requires_grad_(), w.clone().requires_grad_()
    student = torch.log_softmax(h2 @ w2.t(), dim=-1).gather(-1, ids)
    assert (student < -2.0).any() and (lps < -2.0).any()  # the clamp is exercised on both sides
    teacher = lps.clamp_min(-2.0)
    expected = (teacher.exp() * (teacher - student.clamp_min(-2.0))).sum(-1)
    expected.sum().backward()
    torch.testing.assert_close(kl, expected)
    torch.testing.assert_close(mass, student.detach().exp().sum(-1))
    torch.testing.assert_close(h1.grad, h2.grad)
    torch.testing.assert_close(w1.grad, w2.grad)


def test_a_student_equal_to_the_teacher_has_zero_loss_and_its_mass():
    h, _, w_teacher = _inputs(seed=1)
    ids, lps = chunked_topk_log_probs(h, w_teacher, k=5)
    kl, mass = chunked_topk_forward_kl(h, w_teacher, ids, lps)
    torch.testing.assert_close(kl, torch.zeros_like(kl), atol=1e-6, rtol=0)
    torch.testing.assert_close(mass, lps.double().exp().sum(-1))
