"""On-device sampling with per-row counter-based randomness, safe to capture in a CUDA graph.

Every random number is a hash of (row seed, step) — and, for Gumbel-max, of a vocabulary index: it does
not depend on the batch the row sits in, on its slot, or on how many steps ran before, so a row's token is a
pure function of its seed, its step and its logits.

* Full-vocabulary sampling (T > 0, no top-k / top-p; the RL case) is a two-stage Gumbel-max. The
  vocabulary is cut into fixed groups of GROUP consecutive ids; a Gumbel-max over the groups' log-masses
  picks a group, a Gumbel-max over t_i = logits_i / T inside it picks the id. P(group) * P(id | group) =
  softmax(logits / T)_id exactly. Noise is -log2(-log2(u)) with u = hash(row key, index) (base 2: the
  argmax is the same as with natural logs; the groups draw from a second key). One statistics pass over
  the logits plus GROUP + V / GROUP noise draws per row is what lets the fused kernel (triton_sampling.py,
  the same draws) stay memory-bound; per-id noise over the whole vocabulary would cost ~4x more arithmetic.
* Greedy is the plain argmax (lowest index on ties).
* top-k / top-p draw by inverse CDF over the sorted candidates with one uniform hash(seed, step).
The returned log-probability is always log_softmax(logits / T) of the full, unfiltered distribution (T = 1
for greedy), which is what the trainer's compute_log_prob recomputes; min_new_tokens forbids stop tokens for
the pick only. `SAMPLERS` holds the implementations (`torch` everywhere, `triton` fused kernels on CUDA).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from verlx.utils.registry import Registry

logger = logging.getLogger(__name__)

_MASK32 = 0xFFFFFFFF
GOLDEN = 0x9E3779B9  # odd: multiplying by it permutes 32-bit integers
LOG2E = 1.4426950408889634
GROUP = 1024  # full-vocabulary sampling first picks a group of this many consecutive ids, then an id in it
GROUP_STREAM = 0x5BD1E995  # the group draws hash key ^ this, so they are independent of the id draws


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

    @property
    def full_vocabulary(self) -> bool:
        """Greedy or Gumbel-max over every token (no top-k / top-p candidate filter)."""
        return self.greedy or (self.top_k == 0 and self.top_p >= 1.0)


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


def row_key(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """The 32-bit key of each row's step-th draw (int64 holding [0, 2^32)): hash(hash(seed) + step * GOLDEN)."""
    return hash32((hash32(seeds & _MASK32) + _mul32(steps & _MASK32, GOLDEN)) & _MASK32)


def uniform(seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """float32 in [0, 1 - 2^-24], a pure function of (seed, step) per row (top-k / top-p sampling)."""
    return (row_key(seeds, steps) >> 8).to(torch.float32) * (1.0 / (1 << 24))


def gumbel_noise(keys: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """Base-2 Gumbel noise -log2(-log2(u)) of rows with these keys [b] at indices cols ([n] or [b, n]).

    It equals log2(e) * (standard Gumbel) + a constant, so argmax(log2-weights + noise) is a Gumbel-max draw.
    u = (2 * (hash(key ^ (i * GOLDEN)) >> 9) + 1) / 2^24, built as the fused kernel builds it (a float in
    [1, 2) from 23 hash bits, minus 1 - 2^-24: exact), lies in [2^-24, 1 - 2^-24], so the noise is finite."""
    cols = cols if cols.dim() == 2 else cols[None, :]
    h = hash32(keys[:, None] ^ ((cols * GOLDEN) & _MASK32))
    u = ((h >> 9) | 0x3F800000).to(torch.int32).view(torch.float32) - (1.0 - 2.0**-24)
    return -torch.log2(-torch.log2(u))


# ------------------------------------------------------------------ torch sampling
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


def _grouped_gumbel_argmax(t: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """A draw from softmax over base-2 scores t [b, V] (-inf: never) in two Gumbel-max stages: a group of
    GROUP ids by its log2-mass (noise from the keys' group stream), then an id inside it. Lowest index on ties."""
    rows, vocab = t.shape
    width = min(GROUP, vocab)  # a vocabulary smaller than a group is one group, without padding
    groups = -(-vocab // width)
    padded = F.pad(t, (0, groups * width - vocab), value=float("-inf")).view(rows, groups, width)
    top = padded.amax(-1)
    shift = torch.where(top == float("-inf"), torch.zeros_like(top), top)  # empty group: mass 0, not NaN
    mass = top + torch.log2(torch.exp2(padded - shift[..., None]).sum(-1))
    group_ids = torch.arange(groups, device=t.device)
    group = (mass + gumbel_noise(hash32(keys ^ GROUP_STREAM), group_ids)).argmax(-1)
    cols = group[:, None] * width + torch.arange(width, device=t.device)[None, :]
    inside = padded[torch.arange(rows, device=t.device), group] + gumbel_noise(keys, cols)
    return cols.gather(1, inside.argmax(-1, keepdim=True)).squeeze(1)


def _forbid(scores: torch.Tensor, blocked: torch.Tensor | None, stop_ids: torch.Tensor | None) -> torch.Tensor:
    """scores with the stop ids set to -inf in the blocked rows (a copy; scores itself is left alone)."""
    if blocked is None:
        return scores
    out = scores.clone()
    stop_vals = out.index_select(1, stop_ids)
    out.index_copy_(1, stop_ids, torch.where(blocked, torch.full_like(stop_vals, float("-inf")), stop_vals))
    return out


def sample_tokens(
    logits: torch.Tensor,
    plan: SamplingPlan,
    stop_ids: torch.Tensor | None,
    seeds: torch.Tensor,
    steps: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [b, V] (any float dtype) -> (token ids [b] int64, log-probs [b] float32). No host syncs."""
    raw = logits.float()
    if plan.full_vocabulary:
        # multiply by 1/T (not divide), as the fused kernel does, so both see the same bits
        x = raw * (1.0 / plan.temperature) if plan.temperature != 1.0 else raw
    else:
        x = raw / plan.temperature if plan.temperature != 1.0 else raw
    lse = torch.logsumexp(x, dim=-1)
    blocked = None
    if plan.masks_stop_tokens and stop_ids is not None:
        blocked = (steps < plan.min_new_tokens)[:, None]  # [b, 1]: stop tokens forbidden for these rows
    if plan.greedy:
        tokens = torch.argmax(_forbid(x, blocked, stop_ids), dim=-1)
    elif plan.full_vocabulary:
        t = _forbid(raw * (LOG2E / plan.temperature), blocked, stop_ids)  # one rounding, as in the kernel
        tokens = _grouped_gumbel_argmax(t, row_key(seeds, steps))
    else:
        pick = _forbid(x, blocked, stop_ids)
        u = uniform(seeds, steps)
        if plan.top_k > 0:
            cand_logits, cand_ids = torch.topk(pick, min(plan.top_k, pick.shape[-1]), dim=-1, sorted=True)
        else:
            cand_logits, cand_ids = torch.sort(pick, dim=-1, descending=True)
        tokens = _pick_from_sorted(cand_logits, cand_ids, plan.top_p, u)
    log_probs = x.gather(-1, tokens[:, None]).squeeze(-1) - lse
    return tokens, log_probs


# ------------------------------------------------------------------ implementations
SAMPLERS: Registry[Callable[[torch.device], Any]] = Registry(
    "native sampler", "actor_rollout_ref.rollout.engine_kwargs.native.sampler"
)


@SAMPLERS.register("torch")
class TorchSampler:
    """sample_tokens as plain torch ops: every plan, every device."""

    name = "torch"

    def __init__(self, device: torch.device):
        self.device = device

    def fuses_step(self, plan: SamplingPlan) -> bool:
        return False

    sample = staticmethod(sample_tokens)


@SAMPLERS.register("triton")
def _triton_sampler(device: torch.device):
    from verlx.rollout.native.triton_sampling import TritonSampler

    return TritonSampler(device)


def triton_sampler_usable(device: torch.device) -> str | None:
    """None if the triton sampler can run here (CUDA, or the Triton interpreter on CPU), else why not."""
    if device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"device is {device.type}, not cuda"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def build_sampler(name: str, device: torch.device, vocab: int):
    """`auto` -> triton where usable and self-tested (on `vocab`-wide logits), else torch; an explicit `triton`
    that fails is an error."""
    if name != "auto":
        SAMPLERS.get(name)
    wanted = name if name != "auto" else ("triton" if triton_sampler_usable(device) is None else "torch")
    if wanted == "torch":
        return TorchSampler(device)
    why = triton_sampler_usable(device)
    if why is None:
        try:
            from verlx.rollout.native.triton_sampling import self_test

            why = self_test(device, vocab)
        except Exception as err:  # compile errors of a new triton / GPU
            why = f"{type(err).__name__}: {err}"
    if why is None:
        return SAMPLERS.get("triton")(device)
    if name == "triton":
        raise ValueError(f"engine_kwargs.native.sampler=triton cannot run: {why}; use auto or torch")
    logger.warning("native engine: the triton sampler is not usable (%s); sampling with torch ops", why)
    return TorchSampler(device)
