"""The decode core of continuous batching, under the native request stream (stream.py): decode rounds and slot
compaction.

A round replays the decode step k times without looking at the device, then reads back one small tensor (done
flags and lengths). k is exact when no row can stop early (ignore_eos or no stop ids: the host knows when the
first row hits its limit) and `sync_interval` otherwise. Compaction moves the surviving rows into the lowest slots
so the decode batch shrinks with them.
"""

from __future__ import annotations

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
    """Decode rounds over the slots: which request each slot holds (`slot_row`, -1: free), its last position and
    the tokens it generated, the decode graphs and the KV-length buckets."""

    def __init__(self, model: NativeModel, cache: KVCache, state: SlotState, runner: DecodeRunner,
                 cfg: SchedulerConfig, plan: SamplingPlan):
        self.model, self.cache, self.state, self.runner, self.cfg, self.plan = model, cache, state, runner, cfg, plan
        self.buckets = batch_buckets(state.slots)
        self.device = cache.data.device
        self.stats = GenerationStats()
        slots = state.slots
        self.slot_row, self.slot_pos, self.slot_gen = [-1] * slots, [0] * slots, [0] * slots

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _bucket(self, needed: int) -> int:
        return next(b for b in self.buckets if b >= needed)

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
