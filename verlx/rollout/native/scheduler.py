"""Continuous batching: admit waiting rows into free slots, decode in rounds, collect finished rows.

A round replays the decode step k times without looking at the device, then reads back one small tensor
(done flags and lengths). k is exact when no row can stop early (ignore_eos or no stop ids: the host knows
when the first row hits max_new_tokens) and `sync_interval` otherwise. Freed slots are refilled once enough
are free (`refill_fraction` of the slots, or all remaining rows fit), so long tails do not stall the batch;
when nothing waits, the survivors are compacted into the lowest slots so the decode batch shrinks with them.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field

import torch

from verlx.rollout.native.graphs import DecodeRunner, batch_buckets, round_kv_len
from verlx.rollout.native.kv_cache import KVCache
from verlx.rollout.native.model import NativeModel
from verlx.rollout.native.sampling import SamplingPlan
from verlx.rollout.native.slots import SlotState


@dataclass
class GenerationStats:
    """What one generate call did; times include the device work (each phase ends in a sync)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    decode_steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    kv_bytes_read: int = 0  # K/V bytes the decode attention touched (padded to the KV length bucket)
    weight_bytes_read: int = 0  # weight bytes the decode steps read (the embedding table only when tied)
    rounds: int = 0
    compactions: int = 0
    graph_captures: int = 0
    batch_sizes: list[int] = field(default_factory=list)

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["batch_sizes"] = sorted(set(self.batch_sizes))
        return d


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int
    sync_interval: int
    refill_fraction: float
    kv_len_block: int
    weight_bytes_per_step: int


class Scheduler:
    def __init__(
        self, model: NativeModel, cache: KVCache, state: SlotState, runner: DecodeRunner, cfg: SchedulerConfig
    ):
        self.model, self.cache, self.state, self.runner, self.cfg = model, cache, state, runner, cfg
        self.buckets = batch_buckets(state.slots)
        self.device = cache.data.device

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _bucket(self, needed: int) -> int:
        return next(b for b in self.buckets if b >= needed)

    def generate(
        self, input_ids: torch.Tensor, prompt_lens: list[int], n: int, plan: SamplingPlan, seeds: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, GenerationStats]:
        """Left-padded prompts [B, Lp] (+ real lengths) -> tokens [B*n, R], log-probs [B*n, R], lengths [B*n]."""
        self.input_ids, self.prompt_lens, self.n, self.plan, self.seeds = input_ids, prompt_lens, n, plan, seeds
        rows = len(prompt_lens) * n
        response_len = self.state.response_len
        pad = self.state.pad_token_id
        self.out_tokens = torch.full((rows, response_len), pad, dtype=torch.long, device=self.device)
        self.out_logprobs = torch.zeros(rows, response_len, dtype=torch.float32, device=self.device)
        self.lengths = [0] * rows
        self.stats = GenerationStats()
        captures_before = self.runner.captures
        slots = self.state.slots
        self.slot_row, self.slot_pos, self.slot_gen = [-1] * slots, [0] * slots, [0] * slots
        waiting = deque(range(rows))
        admit_at = max(1, math.ceil(self.cfg.refill_fraction * slots))
        while True:
            free = [s for s in range(slots) if self.slot_row[s] < 0]
            if waiting and (len(free) >= min(admit_at, len(waiting)) or len(free) == slots):
                self._admit([waiting.popleft() for _ in range(min(len(free), len(waiting)))], free)
            elif not waiting:
                if len(free) == slots:
                    break
                self._compact()
            self._decode_round()
        self.stats.graph_captures = self.runner.captures - captures_before
        lengths = torch.tensor(self.lengths, dtype=torch.long, device=self.device)
        return self.out_tokens, self.out_logprobs, lengths, self.stats

    # ------------------------------------------------------------------ admission (prefill)
    def _admit(self, rows: list[int], free: list[int]) -> None:
        start = time.perf_counter()
        by_prompt: dict[int, list[tuple[int, int]]] = {}
        for row, slot in zip(rows, free):
            by_prompt.setdefault(row // self.n, []).append((row, slot))
        prompts = sorted(by_prompt, key=lambda p: self.prompt_lens[p])
        chunk: list[int] = []
        for p in prompts:  # ascending length: the newest prompt sets the chunk's padded length
            if chunk and (len(chunk) + 1) * self.prompt_lens[p] > self.cfg.max_num_batched_tokens:
                self._prefill(chunk, by_prompt)
                chunk = []
            chunk.append(p)
        if chunk:
            self._prefill(chunk, by_prompt)
        self._sync()
        self.stats.prefill_s += time.perf_counter() - start

    def _prefill(self, prompts: list[int], by_prompt: dict[int, list[tuple[int, int]]]) -> None:
        lens = [self.prompt_lens[p] for p in prompts]
        length, width = max(lens), self.input_ids.shape[1]
        dev = self.device
        prompt_idx = torch.tensor(prompts, device=dev)
        starts = torch.tensor([width - n for n in lens], device=dev)
        cols = torch.clamp(starts[:, None] + torch.arange(length, device=dev)[None, :], max=width - 1)
        tokens = self.input_ids.index_select(0, prompt_idx).gather(1, cols)  # right-padded [b, length]
        targets = [(j, row, slot) for j, p in enumerate(prompts) for row, slot in by_prompt[p]]
        owner = torch.tensor([j for j, _, _ in targets], device=dev)
        slots = torch.tensor([s for _, _, s in targets], device=dev)
        hidden = self.model.forward_prompt(tokens, self.cache, slots, owner)
        last = hidden[torch.arange(len(prompts), device=dev), torch.tensor(lens, device=dev) - 1]
        logits = self.model.logits(last).index_select(0, owner)
        seeds = torch.tensor([self.seeds[row] for _, row, _ in targets], dtype=torch.long, device=dev)
        row_lens = torch.tensor([lens[j] for j, _, _ in targets], dtype=torch.long, device=dev)
        self.state.start(slots, seeds, row_lens, logits, self.plan)
        for j, row, slot in targets:
            self.slot_row[slot], self.slot_pos[slot], self.slot_gen[slot] = row, lens[j], 1
        self.stats.prompt_tokens += sum(lens)

    # ------------------------------------------------------------------ decode
    def _decode_round(self) -> None:
        start = time.perf_counter()
        occupied = [s for s, r in enumerate(self.slot_row) if r >= 0]
        batch = self._bucket(occupied[-1] + 1)
        remaining = min(self.plan.max_new_tokens - self.slot_gen[s] for s in occupied)
        steps = min(self.cfg.sync_interval, remaining) if self.plan.can_stop_early else remaining
        if steps > 0:
            self._run_steps(occupied, batch, steps)
            self.stats.decode_steps += steps
            self.stats.weight_bytes_read += steps * self.cfg.weight_bytes_per_step
            self.stats.batch_sizes.append(batch)
        done, gen_len = self.state.read_progress(batch)
        self.stats.rounds += 1
        finished = []
        for s in occupied:
            row = self.slot_row[s]
            self.slot_gen[s] = gen_len[s]
            self.slot_pos[s] = self.prompt_lens[row // self.n] + gen_len[s] - 1
            if done[s]:
                finished.append(s)
        if finished:
            self._collect(finished, gen_len)
        self.stats.decode_s += time.perf_counter() - start

    def _run_steps(self, occupied: list[int], batch: int, steps: int) -> None:
        """Replay `steps` decode steps without looking at the device.

        A backend that reads exact lengths runs them as one stretch over the full cache length (one graph per
        batch bucket) and reads sum(pos + 1) keys per step. The torch backend attends over a KV-length bucket,
        so the stretch is cut where the largest position outgrows a bucket: each piece uses the smallest
        bucket that holds it (the step writing position p attends keys 0..p, so it needs kv_len > p)."""
        bytes_per_token = self.cache.plan.bytes_per_token
        max_len = self.cache.plan.max_len
        if self.model.decode_ops.reads_exact_lengths:
            self.runner.run((batch, max_len, self.plan), steps)
            live = sum(steps * (self.slot_pos[s] + 1) + steps * (steps - 1) // 2 for s in occupied)
            self.stats.kv_bytes_read += (live + steps * (batch - len(occupied))) * bytes_per_token
            return
        top = max(self.slot_pos[s] for s in occupied)
        done = 0
        while done < steps:
            kv_len = round_kv_len(top + done + 1, self.cfg.kv_len_block, max_len)
            piece = min(steps - done, kv_len - top - done)
            self.runner.run((batch, kv_len, self.plan), piece)
            self.stats.kv_bytes_read += piece * batch * kv_len * bytes_per_token
            done += piece

    def _collect(self, slots: list[int], gen_len: list[int]) -> None:
        rows = [self.slot_row[s] for s in slots]
        slot_t = torch.tensor(slots, device=self.device)
        row_t = torch.tensor(rows, device=self.device)
        width = self.state.response_len
        self.out_tokens.index_copy_(0, row_t, self.state.out_tokens.index_select(0, slot_t)[:, :width])
        self.out_logprobs.index_copy_(0, row_t, self.state.out_logprobs.index_select(0, slot_t)[:, :width])
        for s, row in zip(slots, rows):
            self.lengths[row] = gen_len[s]
            self.stats.generated_tokens += gen_len[s]
            self.slot_row[s] = -1
        self.state.release(slot_t)

    def _compact(self) -> None:
        """Move the surviving rows into slots 0..a-1 when that lets the decode batch use a smaller bucket."""
        occupied = [s for s, r in enumerate(self.slot_row) if r >= 0]
        count = len(occupied)
        if self._bucket(count) >= self._bucket(occupied[-1] + 1):
            return
        movers = [s for s in occupied if s >= count]
        holes = [s for s in range(count) if self.slot_row[s] < 0]
        src = torch.tensor(movers, device=self.device)
        dst = torch.tensor(holes, device=self.device)
        self.cache.move_slots(src, dst, max(self.slot_pos[s] for s in movers) + 1)
        self.state.move(src, dst)
        for a, b in zip(movers, holes):
            self.slot_row[b], self.slot_pos[b], self.slot_gen[b] = self.slot_row[a], self.slot_pos[a], self.slot_gen[a]
            self.slot_row[a] = -1
        self.stats.compactions += 1
