"""The native engine's request stream: every generation (batch, partial rollout, agent loop) runs through it.

Requests come one by one (`submit`), each with its own max_new_tokens (enforced on the host: a round never runs past
the nearest per-request limit), and `step()` runs one round: admit waiting requests into free slots (prefill;
requests with the same tokens, a prompt's samples, share one), decode up to `sync_interval` steps (without looking
at the device when no row can stop early), return the requests that finished. Freed slots are refilled once enough
are free (`refill_fraction` of the slots, or every waiting request fits), so long tails do not stall a batch; when
nothing waits, the survivors are compacted into the lowest slots so the decode batch shrinks with them.

The KV of a conversation's previous turn is reused: a finished request's slot is *parked* (its keys and values
kept) and a request that names it (`follows=`) and extends its tokens is admitted into that slot with a prefill
of the new tokens only (the tool results and the next generation prompt). Parked slots are given up, oldest
first, when a waiting request needs a slot, or when compaction needs their place; the request that would have
reused one is then prefilled in full. Parked slots are outside the decode batch or marked done, and a done
slot's decode step only rewrites its own last token's K/V, so a parked prefix is never overwritten.
"""

from __future__ import annotations

import itertools
import math
import time
from collections import deque
from dataclasses import dataclass

import torch

from verlx.rollout.native.graphs import DecodeRunner
from verlx.rollout.native.kv_cache import KVCache
from verlx.rollout.native.model import NativeModel
from verlx.rollout.native.sampling import SamplingPlan
from verlx.rollout.native.scheduler import Scheduler, SchedulerConfig
from verlx.rollout.native.slots import SlotState
from verlx.rollout.stream import ABORT, LENGTH, STOP, Finished, RequestStream, StreamLimits


@dataclass
class _Request:
    key: str
    ids: list[int]
    limit: int
    seed: int
    follows: str | None = None


class NativeStream(Scheduler, RequestStream):
    def __init__(self, model: NativeModel, cache: KVCache, state: SlotState, runner: DecodeRunner,
                 cfg: SchedulerConfig, plan: SamplingPlan, vocab_size: int, params, limits: StreamLimits):
        Scheduler.__init__(self, model, cache, state, runner, cfg, plan)
        RequestStream.__init__(self, params, limits, want_log_probs=True)
        self.vocab_size = vocab_size
        self.admit_at = max(1, math.ceil(cfg.refill_fraction * state.slots))
        self.waiting: deque[int] = deque()
        self.requests: dict[int, _Request] = {}
        self._rows = itertools.count()
        self.parked: dict[str, tuple[int, list[int]]] = {}  # finished request key -> (slot, ids with cached K/V)
        self.reused_tokens = 0
        self._captures_before = runner.captures

    def _submit(self, key: str, ids: list[int], max_new_tokens: int, seed: int, follows: str | None) -> None:
        if max(ids) >= self.vocab_size or min(ids) < 0:
            raise ValueError(f"request {key}: a token id outside the vocabulary [0, {self.vocab_size})")
        row = next(self._rows)
        self.requests[row] = _Request(key, ids, max_new_tokens, seed, follows)
        self.waiting.append(row)

    @torch.no_grad()
    def _step(self) -> list[Finished]:
        """One round: admit what may start, decode, return the requests that finished in it."""
        if self.waiting:
            self._admit_continuations()
        free = self._free_slots()
        if self.waiting and len(free) < len(self.waiting) and self.parked:
            self._evict(list(self.parked)[: len(self.waiting) - len(free)])
            free = self._free_slots()
        running = any(r >= 0 for r in self.slot_row)
        if self.waiting and free and (len(free) >= min(self.admit_at, len(self.waiting)) or not running):
            self._admit_requests([self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))], free)
        elif not self.waiting and running:
            self._compact()
        return self._round()

    def _cancel(self, keys: set[str]) -> list[Finished]:
        """Stop these requests: the running ones with the tokens generated so far (their slots are freed), the
        waiting ones with none."""
        running = [s for s, r in enumerate(self.slot_row) if r >= 0 and self.requests[r].key in keys]
        out = []
        if running:
            slot_t = torch.tensor(running, device=self.device)
            tokens = self.state.out_tokens.index_select(0, slot_t).cpu().tolist()
            logprobs = self.state.out_logprobs.index_select(0, slot_t).cpu().tolist()
            for j, s in enumerate(running):
                n = self.slot_gen[s]
                out.append(Finished(self.requests.pop(self.slot_row[s]).key, tokens[j][:n], logprobs[j][:n], ABORT))
                self.slot_row[s] = -1
            self.state.release(slot_t)
        waiting = [row for row in self.waiting if self.requests[row].key in keys]
        out += [Finished(self.requests.pop(row).key, [], [], ABORT) for row in waiting]
        self.waiting = deque(row for row in self.waiting if row in self.requests)
        return out

    def report(self) -> dict:
        stats = self.stats.as_dict()
        stats["graph_captures"] = self.runner.captures - self._captures_before
        return stats

    # ------------------------------------------------------------------ parked slots (KV reuse across turns)
    def _free_slots(self) -> list[int]:
        parked = {slot for slot, _ in self.parked.values()}
        return [s for s in range(self.state.slots) if self.slot_row[s] < 0 and s not in parked]

    def _evict(self, keys: list[str]) -> None:
        """Give up these parked slots (one release for all)."""
        slots = [self.parked.pop(key)[0] for key in keys]
        self.state.release(torch.tensor(slots, device=self.device))

    def _admit_continuations(self) -> None:
        """Waiting requests whose previous turn is parked with a prefix of their ids: one batched prefill of the
        new tokens only, into the parked slots."""
        start = time.perf_counter()
        rows, slots, cached_lens = [], [], []
        for row in [r for r in self.waiting if self.requests[r].follows in self.parked]:
            request = self.requests[row]
            slot, cached = self.parked.pop(request.follows)
            if len(request.ids) <= len(cached) or request.ids[: len(cached)] != cached:
                self.state.release(torch.tensor([slot], device=self.device))
                continue
            self.waiting.remove(row)
            rows.append(row)
            slots.append(slot)
            cached_lens.append(len(cached))
        if rows:
            self._extend_rows(rows, slots, cached_lens)
        self.stats.prefill_s += time.perf_counter() - start

    def _extend_rows(self, rows: list[int], slots: list[int], cached_lens: list[int]) -> None:
        new = [self.requests[r].ids[n:] for r, n in zip(rows, cached_lens)]
        dev = self.device
        tokens = torch.zeros(len(rows), max(len(x) for x in new), dtype=torch.long)
        for j, ids in enumerate(new):
            tokens[j, : len(ids)] = torch.tensor(ids)
        slot_t = torch.tensor(slots, device=dev)
        lengths = torch.tensor([len(x) for x in new], device=dev)
        hidden = self.model.forward_extend(tokens.to(dev), lengths, torch.tensor(cached_lens, device=dev), self.cache,
                                           slot_t)
        seeds = torch.tensor([self.requests[r].seed for r in rows], dtype=torch.long, device=dev)
        row_lens = [len(self.requests[r].ids) for r in rows]
        self.state.start(slot_t, seeds, torch.tensor(row_lens, dtype=torch.long, device=dev),
                         self.model.logits(hidden), self.plan)
        for row, slot, n in zip(rows, slots, row_lens):
            self.slot_row[slot], self.slot_pos[slot], self.slot_gen[slot] = row, n, 1
        self.stats.prompt_tokens += int(lengths.sum())
        self.reused_tokens += sum(cached_lens)

    def _compact(self) -> None:
        """Parked slots among the holes compaction fills are given up first."""
        count = sum(r >= 0 for r in self.slot_row)
        holes = [k for k, (slot, _) in self.parked.items() if slot < count]
        if holes:
            self._evict(holes)
        super()._compact()

    def _admit_requests(self, rows: list[int], free: list[int]) -> None:
        start = time.perf_counter()
        rows = sorted(rows, key=lambda r: len(self.requests[r].ids))
        chunk: list[int] = []
        distinct: set[tuple[int, ...]] = set()
        slots = iter(free)
        for row in rows:  # ascending length: the newest request sets the chunk's padded length
            ids = tuple(self.requests[row].ids)
            prefills = len(distinct) + (ids not in distinct)  # a prompt's samples share one prefill
            if chunk and prefills * len(ids) > self.cfg.max_num_batched_tokens:
                self._prefill_rows(chunk, [next(slots) for _ in chunk])
                chunk, distinct = [], set()
            chunk.append(row)
            distinct.add(ids)
        if chunk:
            self._prefill_rows(chunk, [next(slots) for _ in chunk])
        self._sync()
        self.stats.prefill_s += time.perf_counter() - start

    def _prefill_rows(self, rows: list[int], slots: list[int]) -> None:
        """Prefill requests into their slots; requests with the same tokens (a prompt's n samples) share one."""
        first: dict[tuple[int, ...], int] = {}
        unique: list[list[int]] = []
        owner_of = []
        for r in rows:
            key = tuple(self.requests[r].ids)
            if key not in first:
                first[key] = len(unique)
                unique.append(self.requests[r].ids)
            owner_of.append(first[key])
        lens = [len(ids) for ids in unique]
        dev = self.device
        tokens = torch.zeros(len(unique), max(lens), dtype=torch.long)
        for j, ids in enumerate(unique):
            tokens[j, : lens[j]] = torch.tensor(ids)
        slot_t = torch.tensor(slots, device=dev)
        owner = torch.tensor(owner_of, device=dev)
        hidden = self.model.forward_prompt(tokens.to(dev), self.cache, slot_t, owner)
        last = hidden[torch.arange(len(unique), device=dev), torch.tensor(lens, device=dev) - 1]
        seeds = torch.tensor([self.requests[r].seed for r in rows], dtype=torch.long, device=dev)
        row_lens = [len(self.requests[r].ids) for r in rows]
        self.state.start(slot_t, seeds, torch.tensor(row_lens, dtype=torch.long, device=dev),
                         self.model.logits(last).index_select(0, owner), self.plan)
        for row, slot, n in zip(rows, slots, row_lens):
            self.slot_row[slot], self.slot_pos[slot], self.slot_gen[slot] = row, n, 1
        self.stats.prompt_tokens += sum(lens)

    def _round(self) -> list[Finished]:
        occupied = [s for s, r in enumerate(self.slot_row) if r >= 0]
        if not occupied:
            return []
        start = time.perf_counter()
        batch = self._bucket(occupied[-1] + 1)
        remaining = min(self.requests[self.slot_row[s]].limit - self.slot_gen[s] for s in occupied)
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
            request = self.requests[self.slot_row[s]]
            self.slot_gen[s] = gen_len[s]
            self.slot_pos[s] = len(request.ids) + gen_len[s] - 1
            if done[s] or gen_len[s] >= request.limit:
                finished.append(s)
        out = self._take(finished, gen_len) if finished else []
        self.stats.decode_s += time.perf_counter() - start
        return out

    def _take(self, slots: list[int], gen_len: list[int]) -> list[Finished]:
        slot_t = torch.tensor(slots, device=self.device)
        width = max(min(gen_len[s], self.requests[self.slot_row[s]].limit) for s in slots)
        tokens = self.state.out_tokens.index_select(0, slot_t)[:, :width].cpu().tolist()
        logprobs = self.state.out_logprobs.index_select(0, slot_t)[:, :width].cpu().tolist()
        out = []
        for j, s in enumerate(slots):
            request = self.requests.pop(self.slot_row[s])
            n = min(gen_len[s], request.limit)
            stopped = self.plan.can_stop_early and n > 0 and tokens[j][n - 1] in self.plan.stop_token_ids
            out.append(Finished(request.key, tokens[j][:n], logprobs[j][:n], STOP if stopped else LENGTH))
            self.stats.generated_tokens += n
            self.slot_row[s] = -1
            # K/V exist for the prompt and every generated token but the last (never fed back)
            self.parked[request.key] = (s, request.ids + tokens[j][: n - 1])
        self.state.done.index_fill_(0, slot_t, True)  # parked: decode steps leave it alone
        return out
