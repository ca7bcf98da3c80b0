"""The driver's generation pipeline for trainer.rollout_mode one_step_off and async (docs/async.md).

One prompt batch at a time is generated on the rollout group while the trainer trains on earlier ones. The driver
is single-threaded: the pipeline advances (`pump`) only when the trainer's workers are idle, at the start of a
step and after each trainer phase (the trainer's loop calls it there, trainer/ppo_trainer.py), so a weight broadcast
never interleaves with a training collective. Policy
versions count finished training steps (the weights after step s are version s): batch j is trained with version
j − 1 (nothing dropped), and its samples are generated with the version the rollout group held when the batch
(or, with partial rollout, its first token) started.

* wait (default): batch j starts only when (j − 1) − trainer version ≤ max_staleness, so no sample ever exceeds
  the bound. max_staleness 0 is sync mode: each batch is generated with the newest weights, then trained.
  one_step_off is max_staleness 1.
* drop: the rollout group keeps max_staleness + 1 batches ready or in flight whatever the trainer's version; a
  batch older than the bound when the trainer takes it is dropped (counted in async/dropped_samples).
* partial rollout: when the trainer's version moves past the one generating, the generation is interrupted, the
  new weights are broadcast, and the unfinished samples continue from their tokens with the new weights.

The saved data position is the one after the last batch the trainer *consumed*: batches generated ahead are not
checkpointed; a resumed run regenerates them from that position in the same order.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from verlx.batch_columns import MODEL_INPUTS, POLICY_VERSION, POLICY_VERSION_LAST, TOKEN_VERSIONS
from verlx.protocol import DataProto
from verlx.utils.errors import VerlxError

logger = logging.getLogger(__name__)
_POLL_S = 0.2


class RolloutStalled(VerlxError, RuntimeError):
    """The rollout group delivered nothing for trainer.rollout_stall_timeout_s seconds."""


@dataclass
class Generated:
    """A generated prompt batch, ready for the trainer."""

    index: int  # the prompt batch's number (1 = the run's first)
    batch: DataProto  # expanded prompts (uid, n samples each) with the generation output and policy versions
    loader_state: dict  # the training loader's state right after this batch's prompts
    metrics: dict[str, float] = field(default_factory=dict)
    dropped: int = 0  # samples dropped as too stale since the previous batch was handed out


@dataclass
class _Job:
    """A prompt batch being generated, over one call, or several with partial rollout."""

    index: int
    prompts: DataProto
    gen_inputs: DataProto
    loader_state: dict
    output: DataProto | None = None
    token_versions: torch.Tensor | None = None
    # per row, the version of the first call that generated it: the version of a row without any model token
    # (an agent loop's sample excluded or cancelled by over_sample_rate, response_mask all zero)
    first_version: torch.Tensor | None = None
    unfinished: torch.Tensor | None = None
    gen_seconds: float = 0.0
    first_start: float | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class _Call:
    job: _Job
    future: object
    rows: torch.Tensor
    pad: int
    version: int
    generation_id: int | None
    started: float


class RolloutPipeline:
    """`prompt_batches` yields prompt batches (the training loader, endlessly); `expand(batch)` adds uid and the n
    samples; `gen_inputs(batch)` selects what the engine reads; `trainer_version()` is the trainer's version now."""

    def __init__(self, config, group, prompt_batches: Iterator[DataProto], loader, expand: Callable,
                 gen_inputs: Callable, trainer_version: Callable[[], int], first_index: int, last_index: int):
        t = config.trainer
        self.config, self.group, self.loader = config, group, loader
        self.prompt_batches, self.expand, self.gen_inputs = prompt_batches, expand, gen_inputs
        self.trainer_version = trainer_version
        self.bound = 1 if t.rollout_mode == "one_step_off" else int(t.max_staleness)
        self.drop = t.staleness_policy == "drop"
        self.partial = t.partial_rollout
        self.stall_s = t.rollout_stall_timeout_s
        self.next_index, self.last_index = first_index, last_index
        self.ready: deque[Generated] = deque()
        self.job: _Job | None = None
        self.call: _Call | None = None
        self.consumed_loader_state = loader.state_dict()
        self.dropped = self.dropped_total = 0
        self.generation_ids = itertools.count()
        self.is_paused = False
        self.last_progress = time.monotonic()

    # ------------------------------------------------------------------ the trainer's side
    def next(self) -> Generated:
        """The next batch to train on; waits (pumping) for the rollout group, at most rollout_stall_timeout_s."""
        start = time.monotonic()
        while True:
            self.pump()
            item = self._take_ready()
            if item is not None:
                item.metrics["async/trainer_wait_s"] = time.monotonic() - start
                item.metrics["async/dropped_samples_total"] = float(self.dropped_total)
                item.dropped, self.dropped = self.dropped, 0
                return item
            self.pump()  # dropped batches made room
            if self.call is None and not self.ready:
                raise RuntimeError(f"rollout pipeline: nothing to wait for ({self._describe()}); this is a bug")
            if self.call is not None:
                self.call.future.wait(_POLL_S)
            idle = time.monotonic() - max(start, self.last_progress)
            if self.stall_s is not None and idle > self.stall_s:
                raise RolloutStalled(
                    f"the rollout group delivered nothing for {idle:.0f}s (trainer.rollout_stall_timeout_s="
                    f"{self.stall_s:g}) while the trainer waited for a batch; it was {self._describe()}")

    def pump(self) -> None:
        """Advance the pipeline as far as it can without waiting; the trainer's workers must be idle."""
        while not self.is_paused:
            version = self.trainer_version()
            if self.call is not None:
                if not (self.call.future.done() or self._interrupt_if_behind(version)):
                    return
                self._absorb()
            if self.job is None and self._may_start(version):
                self.job = self._new_job()
            if self.job is None:
                return
            self._launch(version)

    @contextmanager
    def paused(self):
        """The rollout group idle and left alone (validation uses it): the call in flight finishes first."""
        if self.call is not None:
            self._interrupt_if_behind(self.trainer_version())
            self._absorb()
        self.is_paused = True
        try:
            yield
        finally:
            self.is_paused = False

    def staleness_bound(self) -> int:
        return self.bound

    # ------------------------------------------------------------------ scheduling
    def _may_start(self, version: int) -> bool:
        if self.drop:
            return len(self.ready) < self.bound + 1
        # batch j is trained with version j - 1: start it only if that is within the bound of today's weights
        return self.next_index <= self.last_index and (self.next_index - 1) - version <= self.bound

    def _take_ready(self) -> Generated | None:
        version = self.trainer_version()
        while self.ready:
            item = self.ready.popleft()
            self.consumed_loader_state = item.loader_state
            staleness = version - int(item.batch.batch[POLICY_VERSION].min())
            if self.drop and staleness > self.bound:
                logger.info("dropping prompt batch %d: generated by version %d, the trainer is at %d "
                            "(trainer.max_staleness=%d)", item.index, version - staleness, version, self.bound)
                self.dropped += len(item.batch)
                self.dropped_total += len(item.batch)
                continue
            return item
        return None

    def _interrupt_if_behind(self, version: int) -> bool:
        """Partial rollout: stop the generation whose weights are older than the trainer's."""
        call = self.call
        if not self.partial or call.generation_id is None or call.version >= version:
            return False
        self.group.wg.interrupt_generation(call.generation_id)
        return True

    def _describe(self) -> str:
        if self.call is None:
            return f"idle ({len(self.ready)} batches ready, next prompt batch {self.next_index})"
        age = time.monotonic() - self.call.started
        return (f"generating prompt batch {self.call.job.index} with policy version {self.call.version} "
                f"(generate_sequences on {len(self.call.rows)} samples, started {age:.0f}s ago)")

    # ------------------------------------------------------------------ generation calls
    def _new_job(self) -> _Job:
        prompts = self.expand(next(self.prompt_batches))
        job = _Job(self.next_index, prompts, self.gen_inputs(prompts), self.loader.state_dict())
        rows = len(prompts)
        job.unfinished = torch.ones(rows, dtype=torch.bool)
        job.token_versions = torch.full((rows, self.config.actor_rollout_ref.rollout.response_length), -1,
                                        dtype=torch.long)
        job.first_version = torch.full((rows,), -1, dtype=torch.long)
        self.next_index += 1
        return job

    def _launch(self, version: int) -> None:
        job = self.job
        if self.group.version != version:
            self.group.sync_weights(version, self.stall_s)
        rows = job.unfinished.nonzero().flatten()
        inputs = job.gen_inputs[rows]
        if job.output is not None:  # a continuation: the tokens generated so far come along
            done = job.output[rows]
            inputs.batch.update(partial_responses=done.batch["responses"],
                                partial_log_probs=done.batch["rollout_log_probs"],
                                partial_lengths=done.batch["response_mask"].sum(-1))
        generation_id = next(self.generation_ids) if self.partial else None
        seed = self.config.actor_rollout_ref.rollout.seed + job.index
        inputs.meta_info.update({"do_sample": True, "global_step": job.index,
                                 "seed": seed if generation_id is None else seed * 1009 + generation_id})
        if generation_id is not None:
            inputs.meta_info["generation_id"] = generation_id
        inputs, pad = inputs.pad_to_divisor(self.group.wg.world_size)
        future = self.group.wg.generate_sequences.submit(inputs)
        self.call = _Call(job, future, rows, pad, version, generation_id, time.monotonic())

    def _absorb(self) -> None:
        """Take the finished (or interrupted) call's rows into its job; a complete job becomes ready."""
        call, job = self.call, self.call.job
        out = call.future.get().unpad(call.pad)
        self.call = None
        self.last_progress = time.monotonic()
        job.gen_seconds += out.meta_info.get("timing", {}).get("timing_s/rollout_worker", 0.0)
        started, ended = out.meta_info.get("wall_clock", (0.0, 0.0))
        job.first_start = job.first_start or started
        job.metrics = {**out.meta_info.get("metrics", {}), "timestamp/gen_start": job.first_start,
                       "timestamp/gen_end": ended}
        before = (job.output.batch["response_mask"][call.rows].sum(-1) if job.output is not None
                  else torch.zeros(len(call.rows), dtype=torch.long))
        after = out.batch["response_mask"].sum(-1)
        positions = torch.arange(job.token_versions.shape[1])
        fresh = (positions[None, :] >= before[:, None]) & (positions[None, :] < after[:, None])
        job.token_versions[call.rows] = torch.where(fresh, call.version, job.token_versions[call.rows])
        first = job.first_version[call.rows]
        job.first_version[call.rows] = torch.where(first < 0, call.version, first)
        finished = out.batch.pop("rollout_finished", torch.ones(len(call.rows), dtype=torch.bool))
        out.batch.pop("rollout_new_tokens", None)
        if job.output is None:
            job.output = out
        else:
            for key, value in out.batch.items():
                job.output.batch[key][call.rows] = value
        job.unfinished[call.rows] = ~finished.bool()
        if not job.unfinished.any():
            self.ready.append(self._finish(job))
            self.job = None

    def _finish(self, job: _Job) -> Generated:
        batch = job.prompts
        batch.pop(batch_keys=[k for k in MODEL_INPUTS if k in batch.batch])
        for key in [k for k in job.output.non_tensor_batch if k in batch.non_tensor_batch]:
            job.output.non_tensor_batch.pop(key)
        output = job.output
        output.meta_info = {}
        batch.union(output)
        lengths = batch.batch["response_mask"].sum(-1).clamp(min=1)
        versions = job.token_versions
        last = versions.gather(1, (lengths - 1)[:, None]).squeeze(1)
        batch.batch[POLICY_VERSION] = torch.where(versions[:, 0] >= 0, versions[:, 0], job.first_version)
        batch.batch[POLICY_VERSION_LAST] = torch.where(last >= 0, last, job.first_version)
        if self.partial:
            batch.batch[TOKEN_VERSIONS] = versions
        metrics = {**job.metrics, "timing_s/gen": job.gen_seconds}
        return Generated(job.index, batch, job.loader_state, metrics)
