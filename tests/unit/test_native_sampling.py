"""On-device sampling: distributions, filters, full-distribution log-probs and seed determinism."""

from __future__ import annotations

import math

import torch

from verlx.rollout.base import SamplingParams
from verlx.rollout.native.sampling import plan_from_params, row_seed, sample_tokens, uniform

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
