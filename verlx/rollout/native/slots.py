"""Per-slot decode state on the device, and the decode step that advances it (the body of a CUDA graph).

Everything a step needs lives in fixed buffers indexed by slot, so one captured graph per (batch bucket,
KV length bucket, sampling plan) replays any number of steps with no host work: the step samples, writes
the token and its log-prob into the slot's output row, and decides on the device whether the slot is done.
"""

from __future__ import annotations

import torch

from verlx.rollout.native.kv_cache import KVCache
from verlx.rollout.native.model import NativeModel
from verlx.rollout.native.sampling import SamplingPlan, TorchSampler


class SlotState:
    """Device buffers for `slots` sequences with up to `response_len` generated tokens each.

    tokens: last sampled token (the next step's input); pos: its position; gen_len: tokens generated;
    done: finished (or empty); seeds: the row's random stream. out_tokens / out_logprobs have one spare
    column that done rows write into, so their real outputs are never overwritten. `sampler` (a SAMPLERS
    entry) draws the tokens; one that fuses the step does the bookkeeping below in its own kernel.
    """

    def __init__(self, slots: int, response_len: int, pad_token_id: int, device: torch.device, sampler=None):
        self.slots, self.response_len, self.pad_token_id = slots, response_len, pad_token_id
        self.sampler = sampler if sampler is not None else TorchSampler(device)
        self.tokens = torch.zeros(slots, dtype=torch.long, device=device)
        self.pos = torch.zeros(slots, dtype=torch.long, device=device)
        self.gen_len = torch.zeros(slots, dtype=torch.long, device=device)
        self.done = torch.ones(slots, dtype=torch.bool, device=device)
        self.seeds = torch.zeros(slots, dtype=torch.long, device=device)
        self.out_tokens = torch.full((slots, response_len + 1), pad_token_id, dtype=torch.long, device=device)
        self.out_logprobs = torch.zeros(slots, response_len + 1, dtype=torch.float32, device=device)
        self._stop_ids: dict[tuple[int, ...], torch.Tensor] = {}

    @property
    def nbytes(self) -> int:
        tensors = (self.tokens, self.pos, self.gen_len, self.done, self.seeds, self.out_tokens, self.out_logprobs)
        return sum(t.numel() * t.element_size() for t in tensors)

    def stop_ids(self, plan: SamplingPlan) -> torch.Tensor | None:
        """A persistent device tensor of the plan's stop ids (graphs keep pointing at it)."""
        if not plan.stop_token_ids:
            return None
        if plan.stop_token_ids not in self._stop_ids:
            self._stop_ids[plan.stop_token_ids] = torch.tensor(
                plan.stop_token_ids, dtype=torch.long, device=self.tokens.device
            )
        return self._stop_ids[plan.stop_token_ids]

    def _finished(self, tokens: torch.Tensor, index: torch.Tensor, plan: SamplingPlan, stop_ids) -> torch.Tensor:
        """Whether the token just sampled as the index-th (0-based) one ends its sequence."""
        finished = index + 1 >= plan.max_new_tokens
        if plan.can_stop_early:
            is_stop = (tokens[:, None] == stop_ids[None, :]).any(-1)
            finished = finished | (is_stop & (index >= plan.min_new_tokens))
        return finished

    # ------------------------------------------------------------------ first token (after prefill)
    def start(
        self,
        slots: torch.Tensor,
        seeds: torch.Tensor,
        prompt_lens: torch.Tensor,
        logits: torch.Tensor,
        plan: SamplingPlan,
    ) -> None:
        """Sample the first token of newly prefilled rows from their last prompt logits and arm the slots."""
        stop_ids = self.stop_ids(plan)
        zero = torch.zeros_like(slots)
        tokens, logprobs = self.sampler.sample(logits, plan, stop_ids, seeds, zero)
        self.tokens.index_copy_(0, slots, tokens)
        self.pos.index_copy_(0, slots, prompt_lens)
        self.gen_len.index_fill_(0, slots, 1)
        self.seeds.index_copy_(0, slots, seeds)
        self.done.index_copy_(0, slots, self._finished(tokens, zero, plan, stop_ids))
        self.out_tokens.index_fill_(0, slots, self.pad_token_id)
        self.out_tokens[:, 0].index_copy_(0, slots, tokens)
        self.out_logprobs.index_fill_(0, slots, 0.0)
        self.out_logprobs[:, 0].index_copy_(0, slots, logprobs)

    # ------------------------------------------------------------------ one decode step (graph body)
    def step(self, model: NativeModel, cache: KVCache, batch: int, kv_len: int, plan: SamplingPlan) -> None:
        self.advance(model.decode(self.tokens[:batch], self.pos[:batch], cache, kv_len), plan, batch)

    def advance(self, logits: torch.Tensor, plan: SamplingPlan, batch: int) -> None:
        """Sample slots 0..batch-1 from logits [batch, V], record token and log-prob, move active slots on."""
        if self.sampler.fuses_step(plan):
            self.sampler.step(self, logits, plan, batch)
            return
        stop_ids = self.stop_ids(plan)
        tokens, pos = self.tokens[:batch], self.pos[:batch]
        gen_len, done = self.gen_len[:batch], self.done[:batch]
        new_tokens, logprobs = self.sampler.sample(logits, plan, stop_ids, self.seeds[:batch], gen_len)
        active = ~done
        column = torch.where(done, torch.full_like(gen_len, self.response_len), gen_len)[:, None]
        self.out_tokens[:batch].scatter_(1, column, new_tokens[:, None])
        self.out_logprobs[:batch].scatter_(1, column, logprobs[:, None])
        finished = active & self._finished(new_tokens, gen_len, plan, stop_ids)
        step = active.long()
        gen_len.add_(step)
        pos.add_(step)
        done.logical_or_(finished)
        tokens.copy_(new_tokens)

    # ------------------------------------------------------------------ host-side bookkeeping helpers
    def release(self, slots: torch.Tensor) -> None:
        """Mark slots empty: done, at position 0 (their dummy K/V writes stay in bounds)."""
        self.done.index_fill_(0, slots, True)
        self.pos.index_fill_(0, slots, 0)
        self.tokens.index_fill_(0, slots, 0)
        self.gen_len.index_fill_(0, slots, 0)

    def move(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        for buf in (self.tokens, self.pos, self.gen_len, self.done, self.seeds, self.out_tokens, self.out_logprobs):
            buf.index_copy_(0, dst, buf.index_select(0, src))
        self.release(src)

    def read_progress(self, batch: int) -> tuple[list[bool], list[int]]:
        """(done, gen_len) of slots 0..batch-1 — the one host sync of a decode round."""
        both = torch.stack((self.done[:batch].long(), self.gen_len[:batch])).cpu()
        return [bool(d) for d in both[0].tolist()], both[1].tolist()
