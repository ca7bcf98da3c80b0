"""Requests that arrive while others decode (the agent loop's turns): each joins a free slot at the next round.

A RequestStream shares the engine's model, KV cache, slot state and decode graphs with the batch Scheduler and
reuses its decode pieces; what differs is that requests come one by one (`submit`), each with its own
max_new_tokens (enforced on the host: a round never runs past the nearest per-request limit), and `step()` runs
one round: admit waiting requests into free slots (prefill), decode up to `sync_interval` steps, return the
requests that finished.

The KV of a conversation's previous turn is reused: a finished request's slot is *parked* (its keys and values
kept) and a request that names it (`reuse=`) and extends its tokens is admitted into that slot with a prefill
of the new tokens only (the tool results and the next generation prompt). Parked slots are given up, oldest
first, when a waiting request needs a slot, or when compaction needs their place; the request that would have
reused one is then prefilled in full. Parked slots are outside the decode batch or marked done, and a done
slot's decode step only rewrites its own last token's K/V, so a parked prefix is never overwritten.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from dataclasses import dataclass

import torch

from verlx.rollout.native.graphs import DecodeRunner
from verlx.rollout.native.kv_cache import KVCache
from verlx.rollout.native.model import NativeModel
from verlx.rollout.native.sampling import SamplingPlan
from verlx.rollout.native.scheduler import GenerationStats, Scheduler, SchedulerConfig
from verlx.rollout.native.slots import SlotState


@dataclass
class _Request:
    key: str
    ids: list[int]
    limit: int
    seed: int
    reuse: str | None = None


class RequestStream(Scheduler):
    def __init__(self, model: NativeModel, cache: KVCache, state: SlotState, runner: DecodeRunner,
                 cfg: SchedulerConfig, plan: SamplingPlan, vocab_size: int):
        super().__init__(model, cache, state, runner, cfg)
        self.plan, self.vocab_size = plan, vocab_size
        self.stats = GenerationStats()
        slots = state.slots
        self.slot_row, self.slot_pos, self.slot_gen = [-1] * slots, [0] * slots, [0] * slots
        self.waiting: deque[int] = deque()
        self.requests: dict[int, _Request] = {}
        self._rows = itertools.count()
        self.parked: dict[str, tuple[int, list[int]]] = {}  # finished request key -> (slot, ids with cached K/V)
        self.reused_tokens = 0

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or any(r >= 0 for r in self.slot_row)

    def submit(self, key: str, ids: list[int], max_new_tokens: int, seed: int, reuse: str | None = None) -> None:
        """Queue a request; `reuse`: the key of an earlier request whose prompt and output `ids` extend."""
        limit = int(max_new_tokens)
        if not 1 <= limit <= self.state.response_len:
            raise ValueError(f"request {key}: max_new_tokens={limit} must be in [1, rollout.response_length="
                             f"{self.state.response_len}]")
        if not ids or len(ids) + limit > self.cache.plan.max_len:
            raise ValueError(f"request {key}: {len(ids)} context tokens + max_new_tokens={limit} exceed the engine's "
                             f"max_model_len {self.cache.plan.max_len}; raise rollout.max_model_len")
        if max(ids) >= self.vocab_size or min(ids) < 0:
            raise ValueError(f"request {key}: a token id outside the vocabulary [0, {self.vocab_size})")
        row = next(self._rows)
        self.requests[row] = _Request(key, list(ids), limit, int(seed), reuse)
        self.waiting.append(row)

    @torch.no_grad()
    def step(self) -> list[tuple[str, list[int], list[float]]]:
        """One round; returns (key, generated ids, log-probs) of the requests that finished in it."""
        if self.waiting:
            self._admit_continuations()
        free = self._free_slots()
        while self.waiting and len(free) < len(self.waiting) and self.parked:
            self._evict(next(iter(self.parked)))
            free = self._free_slots()
        if self.waiting and free:
            self._admit_requests([self.waiting.popleft() for _ in range(min(len(free), len(self.waiting)))], free)
        elif not self.waiting and any(r >= 0 for r in self.slot_row):
            self._compact()
        return self._round()

    def cancel_unfinished(self) -> list[tuple[str, list[int], list[float]]]:
        """Stop every request that has not finished (partial rollout: the weights are about to change): (key,
        tokens generated so far, their log-probs) of each, none for those still waiting; their slots are freed."""
        return self.cancel(None)

    def cancel(self, keys: set[str] | None) -> list[tuple[str, list[int], list[float]]]:
        """Stop the unfinished requests named in `keys` (None: all), as cancel_unfinished does."""
        running = [s for s, r in enumerate(self.slot_row) if r >= 0 and (keys is None or self.requests[r].key in keys)]
        out = []
        if running:
            slot_t = torch.tensor(running, device=self.device)
            tokens = self.state.out_tokens.index_select(0, slot_t).cpu().tolist()
            logprobs = self.state.out_logprobs.index_select(0, slot_t).cpu().tolist()
            for j, s in enumerate(running):
                n = self.slot_gen[s]
                out.append((self.requests.pop(self.slot_row[s]).key, tokens[j][:n], logprobs[j][:n]))
                self.slot_row[s] = -1
            self.state.release(slot_t)
        waiting = [row for row in self.waiting if keys is None or self.requests[row].key in keys]
        out += [(self.requests.pop(row).key, [], []) for row in waiting]
        self.waiting = deque(row for row in self.waiting if row in self.requests)
        return out

    # ------------------------------------------------------------------ parked slots (KV reuse across turns)
    def _free_slots(self) -> list[int]:
        parked = {slot for slot, _ in self.parked.values()}
        return [s for s in range(self.state.slots) if self.slot_row[s] < 0 and s not in parked]

    def _evict(self, key: str) -> None:
        slot, _ = self.parked.pop(key)
        self.state.release(torch.tensor([slot], device=self.device))

    def _admit_continuations(self) -> None:
        """Waiting requests whose previous turn is parked with a prefix of their ids: one batched prefill of the
        new tokens only, into the parked slots."""
        start = time.perf_counter()
        rows, slots, cached_lens = [], [], []
        for row in [r for r in self.waiting if self.requests[r].reuse in self.parked]:
            request = self.requests[row]
            slot, cached = self.parked.pop(request.reuse)
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
        for key in [k for k, (slot, _) in self.parked.items() if slot < count]:
            self._evict(key)
        super()._compact()

    def _admit_requests(self, rows: list[int], free: list[int]) -> None:
        start = time.perf_counter()
        rows = sorted(rows, key=lambda r: len(self.requests[r].ids))
        chunk: list[int] = []
        slots = iter(free)
        for row in rows:  # ascending length: the newest request sets the chunk's padded length
            if chunk and (len(chunk) + 1) * len(self.requests[row].ids) > self.cfg.max_num_batched_tokens:
                self._prefill_rows(chunk, [next(slots) for _ in chunk])
                chunk = []
            chunk.append(row)
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

    def _round(self) -> list[tuple[str, list[int], list[float]]]:
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

    def _take(self, slots: list[int], gen_len: list[int]) -> list[tuple[str, list[int], list[float]]]:
        slot_t = torch.tensor(slots, device=self.device)
        width = max(min(gen_len[s], self.requests[self.slot_row[s]].limit) for s in slots)
        tokens = self.state.out_tokens.index_select(0, slot_t)[:, :width].cpu().tolist()
        logprobs = self.state.out_logprobs.index_select(0, slot_t)[:, :width].cpu().tolist()
        out = []
        for j, s in enumerate(slots):
            request = self.requests.pop(self.slot_row[s])
            n = min(gen_len[s], request.limit)
            out.append((request.key, tokens[j][:n], logprobs[j][:n]))
            self.stats.generated_tokens += n
            self.slot_row[s] = -1
            # K/V exist for the prompt and every generated token but the last (never fed back)
            self.parked[request.key] = (s, request.ids + tokens[j][: n - 1])
        self.state.done.index_fill_(0, slot_t, True)  # parked: decode steps leave it alone
        return out
