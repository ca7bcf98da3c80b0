"""On-device sampling with per-row counter-based randomness, safe to capture in a CUDA graph.

The uniform number behind row r's t-th token is hash(seed_r, t): it does not depend on the batch the row
sits in, on its slot, or on how many steps ran before, so a row's output depends only on its seed and its
logits. Sampling is inverse-CDF over the (filtered) distribution; the returned log-probability is always
log_softmax(logits / T) of the full, unfiltered distribution (T = 1 for greedy), which is what the trainer's
compute_log_prob recomputes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class SamplingPlan:
    """The per-call sampling settings baked into a decode graph (hashable: part of the graph key)."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    min_new_tokens: int
    max_new_tokens: int
    ignore_eos: bool
    stop_token_ids: tuple[int, ...]

    @property
    def can_stop_early(self) -> bool:
        return bool(self.stop_token_ids) and not self.ignore_eos

    @property
    def masks_stop_tokens(self) -> bool:
        return bool(self.stop_token_ids) and self.min_new_tokens > 0


def plan_from_params(params) -> SamplingPlan:
    """SamplingParams (verlx.rollout.base) -> SamplingPlan."""
    top_k = int(params.top_k) if params.top_k is not None and params.top_k > 0 else 0
    return SamplingPlan(
        greedy=params.greedy,
        temperature=1.0 if params.greedy else float(params.temperature),
        top_k=0 if params.greedy else top_k,
        top_p=1.0 if params.greedy else float(params.top_p),
        min_new_tokens=int(params.min_new_tokens),
        max_new_tokens=int(params.max_new_tokens),
        ignore_eos=bool(params.ignore_eos),
        stop_token_ids=tuple(sorted(set(int(t) for t in params.stop_token_ids))),
    )


# ------------------------------------------------------------------ counter-based randomness
def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2^32 for x in [0, 2^32) using int64 products that cannot overflow."""
    low = (x & 0xFFFF) * c
    high = ((x >> 16) * c) & 0xFFFF
    return (low + (high << 16)) & _MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer mixer (xor-shift-multiply) on int64 tensors holding values in [0, 2^32)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1 - 2^-24], a pure function of (seed, step) per row."""
    h = hash32((hash32(seeds) + _mul32(steps & _MASK32, 0x9E3779B9)) & _MASK32)
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


def _hash32_int(x: int) -> int:
    x &= _MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & _MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & _MASK32
    return x ^ (x >> 16)


def row_seed(base: int, *keys: int) -> int:
    """Host-side derivation of a row's 32-bit seed from a base seed and its (prompt, sample) keys."""
    h = _hash32_int(base ^ (base >> 32))
    for k in keys:
        h = _hash32_int(h ^ _hash32_int(k + 0x9E3779B9))
    return h


# ------------------------------------------------------------------ sampling
def _pick_from_sorted(cand_logits: torch.Tensor, cand_ids: torch.Tensor, top_p: float, u: torch.Tensor):
    """Inverse-CDF pick among candidates sorted by descending logit, keeping the top-p nucleus."""
    probs = torch.softmax(cand_logits, dim=-1)
    cdf = torch.cumsum(probs, dim=-1)
    last = cand_ids.shape[-1] - 1
    if top_p < 1.0:
        # keep a candidate while the mass before it is below top_p (the first is always kept)
        kept = ((cdf - probs) < top_p).sum(-1, keepdim=True).clamp(min=1)
        total = cdf.gather(-1, kept - 1)
        limit = kept - 1
    else:
        total, limit = cdf[:, -1:], torch.full_like(u[:, None], last, dtype=torch.long)
    j = torch.searchsorted(cdf, (u[:, None] * total).contiguous(), right=True)
    j = torch.minimum(j, limit)
    return cand_ids.gather(-1, j).squeeze(-1)


def sample_tokens(
    logits: torch.Tensor,
    plan: SamplingPlan,
    stop_ids: torch.Tensor | None,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [b, V] (any float dtype) -> (token ids [b] int64, log-probs [b] float32). No host syncs."""
    scaled = not plan.greedy and plan.temperature != 1.0
    block = None
    if plan.masks_stop_tokens and stop_ids is not None:
        block = (steps < plan.min_new_tokens)[:, None]  # [b, 1]: stop tokens forbidden for these rows
    if plan.greedy or plan.top_k > 0 or plan.top_p < 1.0:
        x = logits.float() / plan.temperature if scaled else logits.float()
        lse = torch.logsumexp(x, dim=-1)
        if block is not None:
            x = x.clone() if x.data_ptr() == logits.data_ptr() else x
            stop_vals = x.index_select(1, stop_ids)
            x.index_copy_(1, stop_ids, torch.where(block, torch.full_like(stop_vals, float("-inf")), stop_vals))
        if plan.greedy:
            tokens = torch.argmax(x, dim=-1)
        else:
            u = uniform(seeds, steps)
            if plan.top_k > 0:
                cand_logits, cand_ids = torch.topk(x, min(plan.top_k, x.shape[-1]), dim=-1, sorted=True)
            else:
                cand_logits, cand_ids = torch.sort(x, dim=-1, descending=True)
            tokens = _pick_from_sorted(cand_logits, cand_ids, plan.top_p, u)
        log_probs = x.gather(-1, tokens[:, None]).squeeze(-1) - lse
        return tokens, log_probs
    # plain sampling over the full vocabulary in vocabulary order: one softmax, one cumsum, a binary search
    # at T=1 softmax reads the model-dtype logits directly and computes in float32 (no float copy of [b, V])
    probs = torch.softmax(logits.float() / plan.temperature if scaled else logits, dim=-1, dtype=torch.float32)
    if block is not None:
        # zeroing blocked stop tokens in place is safe for the log-prob below: a blocked row never picks one
        stop_probs = probs.index_select(1, stop_ids)
        probs.index_copy_(1, stop_ids, torch.where(block, torch.zeros_like(stop_probs), stop_probs))
    cdf = torch.cumsum(probs, dim=-1)
    total = cdf[:, -1:].contiguous()
    u = uniform(seeds, steps)
    tokens = torch.searchsorted(cdf, (u[:, None] * total).contiguous(), right=True)
    # never step past the last token with non-zero probability (rounding at the top of the CDF)
    tokens = torch.minimum(tokens, torch.searchsorted(cdf, total, right=False)).squeeze(-1)
    log_probs = torch.log(probs.gather(-1, tokens[:, None]).squeeze(-1))
    return tokens, log_probs
