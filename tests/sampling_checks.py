"""Planted logits and a chi-square statistic shared by the sampler tests (the torch sampler on CPU, the triton
sampler in the interpreter and on a GPU).

The vocabulary spans three sampling groups (the last one partial) with six planted ids; a draw is binned
into the planted ids and "the rest of group g", so both stages of the grouped Gumbel-max are exercised.
"""

from __future__ import annotations

import torch

from verlx.rollout.native.sampling import GROUP, SamplingPlan

VOCAB = 2 * GROUP + 300
PLANTED = {3: 2.0, 1000: 1.0, 1030: 2.5, 2047: 0.5, 2100: 1.5, VOCAB - 1: 2.2}  # the rest sit at -4
# chi-square quantiles at p = 0.001 by degrees of freedom (9 bins - 1; 8 bins - 1 when one id is blocked)
CHI2_999 = {7: 24.32, 8: 26.12}


def planted_row() -> torch.Tensor:
    row = torch.full((VOCAB,), -4.0)
    for token, value in PLANTED.items():
        row[token] = value
    return row  # every value is exact in bfloat16 and float16


def plan(temperature: float = 1.0, greedy: bool = False, stop=(), min_new_tokens: int = 0) -> SamplingPlan:
    return SamplingPlan(greedy=greedy, temperature=1.0 if greedy else temperature, top_k=0, top_p=1.0,
                        min_new_tokens=min_new_tokens, max_new_tokens=64, ignore_eos=False,
                        stop_token_ids=tuple(stop))


def bins(tokens: torch.Tensor) -> torch.Tensor:
    """Bin index per token: position in PLANTED, else len(PLANTED) + its group."""
    out = len(PLANTED) + tokens // GROUP
    for i, token in enumerate(PLANTED):
        out = torch.where(tokens == token, torch.full_like(out, i), out)
    return out


def bin_probs(temperature: float, blocked: tuple[int, ...] = ()) -> torch.Tensor:
    """float64 softmax(planted_row / T) summed into the bins, blocked ids removed and the rest renormalised."""
    weights = torch.softmax(planted_row().double() / temperature, dim=0)
    weights[list(blocked)] = 0.0
    probs = torch.zeros(len(PLANTED) + 3, dtype=torch.float64).index_add_(0, bins(torch.arange(VOCAB)), weights)
    return probs / probs.sum()


def chi_square(tokens: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """(statistic, degrees of freedom) of the binned draws against probs, over the bins with p > 0."""
    observed = torch.bincount(bins(tokens.cpu()), minlength=len(probs)).double()
    keep = probs > 0
    expected = probs[keep] * tokens.numel()
    return float(((observed[keep] - expected) ** 2 / expected).sum()), int(keep.sum()) - 1
