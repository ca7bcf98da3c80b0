"""Fused full-vocabulary sampling (greedy, or grouped Gumbel-max at any temperature) in two Triton kernels.

Same draws as sampling.sample_tokens (the torch reference), with the logits read once in the model dtype:
* a statistics kernel over (row, run of groups) writes, per group of GROUP ids, the max and the sum of
  2^(t - max) of t = logits * log2(e) / T (for the log-prob and the group's mass) and what the pick needs
  (the group's mass without blocked stop tokens, or for greedy its largest allowed logit). No randomness
  here: hashing and two logs per vocabulary entry would make this pass compute-bound;
* a finish kernel per row combines the groups into logsumexp, picks a group by Gumbel-max over the groups'
  log2-masses, reads that group's GROUP logits again and picks an id in it by Gumbel-max, then writes
  token and log_softmax(logits / T)[token]. In a decode step it also does the slot bookkeeping (output row,
  length, position, done flag) that would otherwise be about a dozen tiny torch kernels.
Ties go to the lowest index, as torch.argmax. No host sync, no data-dependent shapes: capturable in a CUDA
graph. Plans with top-k / top-p fall back to sampling.sample_tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from verlx.rollout.native.sampling import (
    GROUP,
    GROUP_STREAM,
    LOG2E,
    SamplingPlan,
    sample_tokens,
)

MAX_RUN = 8  # groups per statistics program at most (a 152k vocabulary: ~19 programs per row)
PROGRAMS_PER_SM = 8  # small batches use shorter runs until about this many programs per SM
_NO_INDEX = tl.constexpr(2**31 - 1)  # "no index": loses every min
_GROUP_STREAM = tl.constexpr(GROUP_STREAM)


@triton.jit
def _hash32(x):
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _gumbel2(key, idx):
    """sampling.gumbel_noise: -log2(-log2(u)), u from 23 bits of hash(key ^ idx * GOLDEN) (exact, in (0, 1))."""
    h = _hash32(key ^ (idx.to(tl.uint32) * 0x9E3779B9))
    u = ((h >> 9) | 0x3F800000).to(tl.float32, bitcast=True) - 0.99999994039535522
    return -tl.log2(-tl.log2(u))


@triton.jit
def _is_blocked(cols, stop_ptr, blocked, NUM_BLOCKED: tl.constexpr):
    hit = cols < 0
    for j in tl.static_range(NUM_BLOCKED):
        hit = hit | (cols == tl.load(stop_ptr + j))
    return hit & blocked


# Scalars that change with the batch or the plan are not specialised on (value 1, divisibility by 16), so the
# variants the self-test compiles at construction are the ones generate launches.
@triton.jit(do_not_specialize=["run", "min_new_tokens"])
def _group_stats_kernel(
    logits_ptr, steps_ptr, stop_ptr, stats_ptr,
    stride_row, vocab, groups, run, scale2, min_new_tokens,
    GREEDY: tl.constexpr, NUM_BLOCKED: tl.constexpr, GROUP: tl.constexpr,
):
    row = tl.program_id(0)
    first = tl.program_id(1) * run
    last = tl.minimum(first + run, groups)
    lanes = tl.arange(0, GROUP)
    row_ptr = logits_ptr + row.to(tl.int64) * stride_row
    stats_row = stats_ptr + row.to(tl.int64) * groups * 3
    if NUM_BLOCKED > 0:
        blocked = tl.load(steps_ptr + row) < min_new_tokens
    for g in range(first, last):
        cols = g * GROUP + lanes
        x = tl.load(row_ptr + cols, mask=cols < vocab, other=float("-inf")).to(tl.float32)
        t = x * scale2
        top = tl.max(t, axis=0)
        shift = tl.where(top == float("-inf"), 0.0, top)  # an all -inf group has mass 0, not NaN
        p = tl.exp2(t - shift)
        if NUM_BLOCKED > 0:
            allowed = ~_is_blocked(cols, stop_ptr, blocked, NUM_BLOCKED)
        if GREEDY:
            if NUM_BLOCKED > 0:
                x = tl.where(allowed, x, float("-inf"))
            pick = tl.max(x, axis=0)  # the group's best allowed logit
        elif NUM_BLOCKED > 0:
            pick = tl.sum(tl.where(allowed, p, 0.0), axis=0)  # the group's mass without blocked stop tokens
        else:
            pick = tl.sum(p, axis=0)
        tl.store(stats_row + 3 * g, top)
        tl.store(stats_row + 3 * g + 1, tl.sum(p, axis=0))
        tl.store(stats_row + 3 * g + 2, pick)


@triton.jit(do_not_specialize=["min_new_tokens", "max_new_tokens", "response_len", "stride_out_tokens",
                               "stride_out_logprobs"])
def _finish_kernel(
    logits_ptr, seeds_ptr, steps_ptr, stop_ptr, stats_ptr, token_ptr, logprob_ptr,
    done_ptr, pos_ptr, out_tokens_ptr, out_logprobs_ptr,
    stride_row, vocab, groups, scale2, inv_temperature, min_new_tokens, max_new_tokens, response_len,
    stride_out_tokens, stride_out_logprobs,
    GREEDY: tl.constexpr, NUM_BLOCKED: tl.constexpr, NUM_STOPPING: tl.constexpr, RECORD: tl.constexpr,
    GROUPS_PAD: tl.constexpr, GROUP: tl.constexpr,
):
    row = tl.program_id(0)
    step = tl.load(steps_ptr + row)
    key = _hash32(_hash32(tl.load(seeds_ptr + row).to(tl.uint32)) + step.to(tl.uint32) * 0x9E3779B9)
    # logsumexp and the group pick from the per-group statistics
    g = tl.arange(0, GROUPS_PAD)
    valid = g < groups
    stats_row = stats_ptr + row.to(tl.int64) * groups * 3
    top = tl.load(stats_row + 3 * g, mask=valid, other=float("-inf"))
    total = tl.load(stats_row + 3 * g + 1, mask=valid, other=0.0)
    pick = tl.load(stats_row + 3 * g + 2, mask=valid, other=1.0)  # padding: any finite value, masked below
    top_all = tl.max(top, axis=0)
    shift = tl.where(top_all == float("-inf"), 0.0, top_all)
    lse2 = shift + tl.log2(tl.sum(total * tl.exp2(top - shift), axis=0))
    if GREEDY:
        score = pick
    else:
        score = top + tl.log2(pick) + _gumbel2(_hash32(key ^ _GROUP_STREAM), g)
    score = tl.where(valid, score, float("-inf"))
    best = tl.max(score, axis=0)
    group = tl.minimum(tl.min(tl.where(score == best, g, _NO_INDEX), axis=0), groups - 1)  # NaN rows stay in range
    # the id inside the chosen group
    cols = group * GROUP + tl.arange(0, GROUP)
    x = tl.load(logits_ptr + row.to(tl.int64) * stride_row + cols, mask=cols < vocab, other=float("-inf"))
    x = x.to(tl.float32)
    if GREEDY:
        score = x
    else:
        score = x * scale2 + _gumbel2(key, cols)
    if NUM_BLOCKED > 0:
        score = tl.where(_is_blocked(cols, stop_ptr, step < min_new_tokens, NUM_BLOCKED), float("-inf"), score)
    score = tl.where(cols < vocab, score, float("-inf"))
    best = tl.max(score, axis=0)
    token = tl.minimum(tl.min(tl.where(score == best, cols, _NO_INDEX), axis=0), vocab - 1)
    x_token = tl.sum(tl.where(cols == token, x, 0.0), axis=0)
    logprob = x_token * inv_temperature - lse2 * 0.6931471805599453
    token = token.to(tl.int64)
    if RECORD:
        # SlotState.step's bookkeeping: write at column gen_len (done rows: the spare last column), then
        # advance the active rows and mark those that finished
        done = tl.load(done_ptr + row) != 0
        column = tl.where(done, response_len, step)
        tl.store(out_tokens_ptr + row.to(tl.int64) * stride_out_tokens + column, token)
        tl.store(out_logprobs_ptr + row.to(tl.int64) * stride_out_logprobs + column, logprob)
        finished = step + 1 >= max_new_tokens
        if NUM_STOPPING > 0:
            is_stop = token < 0
            for j in tl.static_range(NUM_STOPPING):
                is_stop = is_stop | (token == tl.load(stop_ptr + j))
            finished = finished | (is_stop & (step >= min_new_tokens))
        advance = tl.where(done, 0, 1)
        tl.store(steps_ptr + row, step + advance)
        tl.store(pos_ptr + row, tl.load(pos_ptr + row) + advance)
        tl.store(done_ptr + row, (done | finished).to(tl.int1))
    tl.store(token_ptr + row, token)
    tl.store(logprob_ptr + row, logprob)


class TritonSampler:
    """`sample` (any plan; full-vocabulary plans fused) and `step` (sampling + slot bookkeeping fused)."""

    name = "triton"

    def __init__(self, device: torch.device):
        self.device = device
        if device.type == "cuda":
            self.num_sms = torch.cuda.get_device_properties(device).multi_processor_count
        else:
            self.num_sms = 1  # the interpreter: still several programs per row for a vocabulary of a few groups

    def layout(self, batch: int, vocab: int) -> tuple[int, int]:
        """(groups, run): vocabulary groups per row and groups per statistics program."""
        groups = triton.cdiv(vocab, GROUP)
        wanted = max(triton.cdiv(groups, MAX_RUN), triton.cdiv(PROGRAMS_PER_SM * self.num_sms, batch))
        return groups, triton.cdiv(groups, min(wanted, groups))

    def fuses_step(self, plan: SamplingPlan) -> bool:
        return plan.full_vocabulary

    def sample(self, logits, plan: SamplingPlan, stop_ids, seeds, steps):
        """sampling.sample_tokens' contract: logits [b, V] -> (tokens [b] int64, log-probs [b] float32)."""
        if not plan.full_vocabulary:
            return sample_tokens(logits, plan, stop_ids, seeds, steps)
        tokens = torch.empty(logits.shape[0], dtype=torch.long, device=logits.device)
        logprobs = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        self._launch(logits, plan, stop_ids, seeds, steps, tokens, logprobs, None)
        return tokens, logprobs

    def step(self, state, logits, plan: SamplingPlan, batch: int) -> None:
        """Sample slots 0..batch-1 from logits [batch, V] and advance them in `state` (a SlotState) exactly as
        SlotState.step does with torch ops."""
        logprobs = torch.empty(batch, dtype=torch.float32, device=logits.device)
        self._launch(logits, plan, state.stop_ids(plan), state.seeds, state.gen_len, state.tokens, logprobs, state)

    def _launch(self, logits, plan, stop_ids, seeds, steps, tokens, logprobs, state) -> None:
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        batch, vocab = logits.shape
        groups, run = self.layout(batch, vocab)
        stats = torch.empty(batch * groups * 3, dtype=torch.float32, device=logits.device)
        scale2 = LOG2E / plan.temperature
        stops = stop_ids if stop_ids is not None else tokens
        blocked = len(plan.stop_token_ids) if plan.masks_stop_tokens and stop_ids is not None else 0
        _group_stats_kernel[(batch, triton.cdiv(groups, run))](
            logits, steps, stops, stats, logits.stride(0), vocab, groups, run, scale2, plan.min_new_tokens,
            GREEDY=plan.greedy, NUM_BLOCKED=blocked, GROUP=GROUP,
        )
        if state is None:
            record = (tokens, tokens, tokens, logprobs)
            strides, response_len, stopping = (0, 0), 0, 0
        else:
            record = (state.done, state.pos, state.out_tokens, state.out_logprobs)
            strides = (state.out_tokens.stride(0), state.out_logprobs.stride(0))
            response_len = state.response_len
            stopping = len(plan.stop_token_ids) if plan.can_stop_early else 0
        _finish_kernel[(batch,)](
            logits, seeds, steps, stops, stats, tokens, logprobs, *record,
            logits.stride(0), vocab, groups, scale2, 1.0 / plan.temperature, plan.min_new_tokens,
            plan.max_new_tokens, response_len, *strides,
            GREEDY=plan.greedy, NUM_BLOCKED=blocked, NUM_STOPPING=stopping, RECORD=state is not None,
            GROUPS_PAD=triton.next_power_of_2(groups), GROUP=GROUP,
        )


def self_test(device: torch.device, vocab: int) -> str | None:
    """The fused kernels against the torch sampler on random logits of the model's vocabulary size (so the
    kernel variants generate needs are compiled now, not inside the first timed call): greedy, T = 1, and
    T = 0.7 with blocked stop ids, each as `sample` and as a fused decode step. None if tokens and slot
    buffers agree and log-probs agree to float32 rounding, else what differed."""
    from verlx.rollout.native.slots import SlotState

    rows = 6
    gen = torch.Generator(device=device).manual_seed(0)
    logits = (torch.randn(rows, vocab, generator=gen, device=device) * 3).to(torch.bfloat16)
    seeds = torch.arange(rows, device=device, dtype=torch.long) * 7919 + 11
    steps = torch.arange(rows, device=device, dtype=torch.long)
    stop_ids = torch.unique(logits.float().argmax(-1)[:2])
    sampler = TritonSampler(device)
    for greedy, temperature, min_new, stops in ((True, 1.0, 0, ()), (False, 1.0, 0, ()),
                                                 (False, 0.7, 3, tuple(stop_ids.tolist()))):
        plan = SamplingPlan(greedy=greedy, temperature=temperature, top_k=0, top_p=1.0, min_new_tokens=min_new,
                            max_new_tokens=8, ignore_eos=False, stop_token_ids=stops)
        stop = stop_ids if stops else None
        want_tokens, want_lp = sample_tokens(logits, plan, stop, seeds, steps)
        tokens, lp = sampler.sample(logits, plan, stop, seeds, steps)
        what = f"greedy={greedy}, T={temperature}, stop ids {list(stops)}"
        if not torch.equal(tokens, want_tokens):
            return f"tokens differ ({what}): {tokens.tolist()} vs {want_tokens.tolist()}"
        err = (lp - want_lp).abs().max().item()
        if not err <= 1e-4:
            return f"log-probs differ by {err:.3g} ({what})"
        states = [SlotState(rows, 8, 0, device, s) for s in (None, sampler)]
        for state in states:
            state.seeds.copy_(seeds)
            state.gen_len.copy_(steps)
            state.done.fill_(False)
            state.advance(logits, plan, rows)
        for name in ("tokens", "pos", "gen_len", "done", "out_tokens"):
            if not torch.equal(getattr(states[0], name), getattr(states[1], name)):
                return f"fused decode step leaves {name} different ({what})"
    return None
