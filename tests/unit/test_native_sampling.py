"""On-device sampling: distributions, filters, full-distribution log-probs and seed determinism."""

from __future__ import annotations

import math

import pytest
import torch

from verlx.rollout.base import SamplingParams
from verlx.rollout.native.sampling import plan_from_params, sample_tokens, uniform
from verlx.rollout.seeds import row_seed

ROWS = 40000
PROBS = torch.tensor([0.1, 0.2, 0.3, 0.4])


def draw(plan_kwargs, logits_row=None, stop=None, steps=None):
    params = SamplingParams(**{"max_new_tokens": 8, "stop_token_ids": stop or [], **plan_kwargs})
    plan = plan_from_params(params)
    logits = (logits_row if logits_row is not None else PROBS.log()).expand(ROWS, -1).contiguous()
    seeds = torch.tensor([row_seed(7, i) for i in range(ROWS)])
    steps = torch.zeros(ROWS, dtype=torch.long) if steps is None else steps
    stop_ids = None if stop is None else torch.tensor(stop)
    return sample_tokens(logits, plan, stop_ids, seeds, steps)


def frequencies(tokens, vocab=4):
    return torch.bincount(tokens, minlength=vocab).float() / tokens.numel()


def test_uniform_is_a_pure_function_of_seed_and_step():
    seeds = torch.tensor([row_seed(1, i) for i in range(ROWS)])
    steps = torch.arange(ROWS) % 97
    u = uniform(seeds, steps)
    assert torch.equal(u, uniform(seeds, steps))
    assert torch.equal(uniform(seeds[5:6], steps[5:6]), u[5:6])  # alone or in a batch: the same number
    assert not torch.equal(u, uniform(seeds, steps + 1))
    # uniform on [0, 1): mean 1/2, 10% below 0.1, standard error ~0.0015 at 40000 draws
    assert abs(u.mean().item() - 0.5) < 0.006
    assert abs((u < 0.1).float().mean().item() - 0.1) < 0.006
    assert u.min() >= 0 and u.max() < 1


def test_plain_sampling_follows_softmax_and_reports_its_log_probs():
    tokens, logprobs = draw(dict(temperature=1.0))
    torch.testing.assert_close(frequencies(tokens), PROBS, atol=0.01, rtol=0)
    torch.testing.assert_close(logprobs, PROBS.log()[tokens], atol=1e-6, rtol=0)


def test_temperature_sharpens_and_log_probs_use_logits_over_t():
    tokens, logprobs = draw(dict(temperature=0.5))
    expected = PROBS**2 / (PROBS**2).sum()  # softmax(log p / 0.5) = p^2 / sum p^2 = [1, 4, 9, 16] / 30
    torch.testing.assert_close(frequencies(tokens), expected, atol=0.01, rtol=0)
    torch.testing.assert_close(logprobs, expected.log()[tokens], atol=1e-6, rtol=0)


def test_top_k_samples_among_the_k_best_but_reports_full_distribution_log_probs():
    tokens, logprobs = draw(dict(temperature=1.0, top_k=2))
    torch.testing.assert_close(frequencies(tokens), torch.tensor([0, 0, 3 / 7, 4 / 7]), atol=0.01, rtol=0)
    torch.testing.assert_close(logprobs, PROBS.log()[tokens], atol=1e-6, rtol=0)


def test_top_p_keeps_the_nucleus():
    # sorted: 0.4, 0.3 | 0.2, 0.1 — mass before 0.3 is 0.4 < 0.5 so it stays; before 0.2 it is 0.7
    tokens, logprobs = draw(dict(temperature=1.0, top_p=0.5))
    torch.testing.assert_close(frequencies(tokens), torch.tensor([0, 0, 3 / 7, 4 / 7]), atol=0.01, rtol=0)
    torch.testing.assert_close(logprobs, PROBS.log()[tokens], atol=1e-6, rtol=0)
    # top-k 3 then top-p 0.6 over the renormalised top 3 (0.4/0.9, 0.3/0.9, 0.2/0.9): mass before the third is
    # 0.7/0.9 = 0.78 >= 0.6, so again two tokens survive
    tokens, _ = draw(dict(temperature=1.0, top_k=3, top_p=0.6))
    torch.testing.assert_close(frequencies(tokens), torch.tensor([0, 0, 3 / 7, 4 / 7]), atol=0.01, rtol=0)


def test_greedy_takes_the_argmax_with_log_softmax_at_t1():
    tokens, logprobs = draw(dict(temperature=0.0))
    assert torch.all(tokens == 3)
    torch.testing.assert_close(logprobs, torch.full((ROWS,), math.log(0.4)), atol=1e-6, rtol=0)


def test_min_new_tokens_blocks_stop_tokens_only_before_the_minimum():
    # token 3 (p=0.4) is the stop token; rows at step 0 must not emit it (min_new_tokens=1), rows at step 1 may
    steps = (torch.arange(ROWS) % 2).long()
    tokens, logprobs = draw(dict(temperature=1.0, min_new_tokens=1), stop=[3], steps=steps)
    blocked, free = tokens[steps == 0], tokens[steps == 1]
    torch.testing.assert_close(frequencies(blocked), torch.tensor([1 / 6, 2 / 6, 3 / 6, 0]), atol=0.012, rtol=0)
    torch.testing.assert_close(frequencies(free), PROBS, atol=0.012, rtol=0)
    torch.testing.assert_close(logprobs, PROBS.log()[tokens], atol=1e-6, rtol=0)  # unfiltered distribution
    greedy, greedy_lp = draw(dict(temperature=0.0, min_new_tokens=1), stop=[3], steps=steps)
    assert torch.all(greedy[steps == 0] == 2) and torch.all(greedy[steps == 1] == 3)
    torch.testing.assert_close(greedy_lp, PROBS.log()[greedy], atol=1e-6, rtol=0)


def test_zero_probability_tokens_are_never_sampled():
    row = torch.tensor([0.0, float("-inf"), 1.0, float("-inf")])
    tokens, _ = draw(dict(temperature=1.0), logits_row=row)
    assert set(tokens.unique().tolist()) == {0, 2}


# ------------------------------------------------------------------ grouped Gumbel-max (full vocabulary)
def planted_draw(temperature, rows=8000, stop=(), min_new=0):
    from sampling_checks import plan, planted_row

    logits = planted_row().expand(rows, -1).contiguous()
    seeds = torch.tensor([row_seed(11, i) for i in range(rows)])
    steps = torch.arange(rows) % 13
    stop_ids = torch.tensor(stop, dtype=torch.long) if stop else None
    tokens, logprobs = sample_tokens(logits, plan(temperature, stop=stop, min_new_tokens=min_new), stop_ids, seeds,
                                     steps)
    return logits, tokens, logprobs, steps


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_full_vocabulary_draws_follow_softmax_across_groups(temperature):
    """8000 draws over a vocabulary of three groups: chi-square against softmax(logits / T) binned into the
    six planted ids and the rest of each group stays below the p = 0.001 quantile; log-probs are log_softmax."""
    from sampling_checks import CHI2_999, bin_probs, chi_square

    logits, tokens, logprobs, _ = planted_draw(temperature)
    stat, dof = chi_square(tokens, bin_probs(temperature))
    assert dof == 8 and stat < CHI2_999[dof], stat
    expected = torch.log_softmax(logits * (1.0 / temperature), dim=-1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)


def test_blocked_stop_token_leaves_the_others_in_proportion():
    """Stop id 1030 (the most likely id, inside group 1) is forbidden for rows before min_new_tokens: it is
    never drawn there, the other bins keep their relative odds (its group loses exactly its mass), and rows
    past the minimum draw it at its full probability; log-probs stay those of the unfiltered distribution."""
    from sampling_checks import CHI2_999, bin_probs, chi_square

    logits, tokens, logprobs, steps = planted_draw(1.0, stop=(1030,), min_new=7)
    early, late = tokens[steps < 7], tokens[steps >= 7]
    assert not (early == 1030).any()
    stat, dof = chi_square(early, bin_probs(1.0, blocked=(1030,)))
    assert dof == 7 and stat < CHI2_999[dof], stat
    stat, dof = chi_square(late, bin_probs(1.0))
    assert dof == 8 and stat < CHI2_999[dof], stat
    expected = torch.log_softmax(logits, dim=-1).gather(1, tokens[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs, expected, atol=1e-5, rtol=0)


def test_full_vocabulary_draw_is_a_pure_function_of_seed_step_and_logits():
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(12, 3000, generator=gen) * 2
    seeds = torch.tensor([row_seed(5, i) for i in range(12)])
    steps = torch.arange(12) * 3
    p = plan_from_params(SamplingParams(temperature=0.8, max_new_tokens=8))
    tokens, logprobs = sample_tokens(logits, p, None, seeds, steps)
    order = torch.tensor([7, 2, 11, 0])
    alone, alone_lp = sample_tokens(logits[order], p, None, seeds[order], steps[order])
    assert torch.equal(alone, tokens[order]) and torch.equal(alone_lp, logprobs[order])
    later, _ = sample_tokens(logits, p, None, seeds, steps + 1)
    assert (later != tokens).sum() >= 6  # another step is another draw (12 rows, ~3000 plausible ids each)


def test_gumbel_uniforms_are_exact_odd_multiples_of_2_to_minus_24():
    """u = float(1 + (h >> 9) / 2^23) - (1 - 2^-24) must equal (2 * (h >> 9) + 1) / 2^24 exactly, so the torch and
    triton samplers get bit-identical uniforms; the extremes give finite noise."""
    from verlx.rollout.native.sampling import gumbel_noise, hash32

    keys = torch.tensor([0, 1, 0xFFFFFFFF, 0x12345678])
    cols = torch.arange(5000)
    h = hash32(keys[:, None] ^ ((cols * 0x9E3779B9) & 0xFFFFFFFF)[None, :])
    u = ((h >> 9) | 0x3F800000).to(torch.int32).view(torch.float32) - (1.0 - 2.0**-24)
    assert torch.equal(u.double(), ((h >> 9) * 2 + 1).double() / 2**24)
    noise = gumbel_noise(keys, cols)
    torch.testing.assert_close(noise.double(), -torch.log2(-torch.log2(u.double())), atol=1e-5, rtol=0)
    extremes = torch.tensor([2.0**-24, 1 - 2.0**-24], dtype=torch.float64)
    assert torch.isfinite(-torch.log2(-torch.log2(extremes.float()))).all()
