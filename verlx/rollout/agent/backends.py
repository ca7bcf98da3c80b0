"""How an engine takes the agent loop's requests as they come: one `generate(ids, max_new_tokens, key)` coroutine
per request, whatever the engine. Registry AGENT_BACKENDS by rollout.name:

* native: the engine's request stream (verlx/rollout/native/stream.py): requests join the running batch at the
  next decode round (every `sync_interval` steps); a finished request frees its slot at once.
* sglang: `Engine.async_generate` per request on the engine's own event loop (SGLang batches them continuously).
* vllm: `llm_engine.add_request` per request and `llm_engine.step()` in a driver task (continuous batching).
The hf engine (and a custom engine) has none: the agent-loop rollout with it is refused before anything starts.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import itertools
from dataclasses import dataclass

from verlx.rollout.base import SamplingParams
from verlx.utils.registry import Registry

AGENT_BACKENDS: Registry[type[GenerationBackend]] = Registry("agent-loop engine backend",
                                                               "actor_rollout_ref.rollout.name")


@dataclass
class GenOutput:
    ids: list[int]
    log_probs: list[float] | None
    finish_reason: str


class GenerationBackend(abc.ABC):
    """One batch's connection to an engine. `run(coro)` runs the batch's coroutine where the engine needs it
    (its own event loop, or only on the tensor-parallel leader) and returns its result on every rank."""

    def __init__(self, engine, params: SamplingParams, want_log_probs: bool):
        self.engine = engine
        self.params = params
        self.want_log_probs = want_log_probs

    @abc.abstractmethod
    async def generate(self, ids: list[int], max_new_tokens: int, key: tuple[int, int]) -> GenOutput:
        """key: (sample index, turn index), for the sampling seed."""

    async def start(self) -> None:
        """Start driver tasks (inside the running loop)."""

    async def stop(self) -> None:
        """Stop them; pending requests are cancelled."""

    def cut(self) -> None:
        """over_sample_rate: abort every request in flight now (their samples are being cancelled). Called from
        the running loop."""

    def run(self, make_coro):
        return asyncio.run(make_coro())

    def _sampling(self, max_new_tokens: int) -> SamplingParams:
        return SamplingParams(**{**self.params.__dict__, "n": 1, "max_new_tokens": int(max_new_tokens)})


class SteppedBackend(GenerationBackend):
    """For engines that advance in steps driven from Python (native, vLLM): requests queue up; a driver task
    submits them, runs one engine step, resolves finished requests, and yields so the samples can react."""

    def __init__(self, engine, params: SamplingParams, want_log_probs: bool):
        super().__init__(engine, params, want_log_probs)
        self._queue: list[tuple[str, list[int], int, tuple[int, int]]] = []
        self._futures: dict[str, asyncio.Future] = {}
        self._ids = itertools.count()
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.error: BaseException | None = None

    async def generate(self, ids, max_new_tokens, key) -> GenOutput:
        if self.error is not None:
            raise RuntimeError(f"the engine failed earlier in this batch: {self.error}") from self.error
        request_id = str(next(self._ids))
        future = asyncio.get_running_loop().create_future()
        self._futures[request_id] = future
        self._queue.append((request_id, list(ids), int(max_new_tokens), key))
        self._wake.set()
        return await future

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._drive())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._close()

    async def _drive(self) -> None:
        try:
            while True:
                if not self._queue and not self._busy():
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                queued, self._queue = self._queue, []
                for request_id, ids, max_new, key in queued:
                    try:
                        self._submit(request_id, ids, max_new, key)
                    except ValueError as e:  # this request is refused; the others go on
                        self._resolve(request_id, e)
                for request_id, output in self._step():
                    self._resolve(request_id, output)
                await asyncio.sleep(0)
        except Exception as e:  # the engine failed: every waiting and later sample gets the error
            self.error = e
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(e)
            self._futures.clear()

    def _resolve(self, request_id: str, outcome: GenOutput | Exception) -> None:
        """Hand a request's outcome to its sample, unless that sample was cancelled (over_sample_rate)."""
        future = self._futures.pop(request_id, None)
        if future is None or future.done():
            return
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)

    def cut(self) -> None:
        """Queued requests are never submitted, the engine aborts the running ones; their samples are being
        cancelled (a result that still arrives is dropped)."""
        self._queue = []
        pending = set(self._futures)
        self._futures.clear()
        self._abort(pending)

    @abc.abstractmethod
    def _submit(self, request_id: str, ids: list[int], max_new_tokens: int, key: tuple[int, int]) -> None: ...

    @abc.abstractmethod
    def _step(self) -> list[tuple[str, GenOutput]]: ...

    @abc.abstractmethod
    def _busy(self) -> bool: ...

    @abc.abstractmethod
    def _abort(self, request_ids: set[str]) -> None:
        """Stop these requests in the engine (ids it never received, or that already finished, are ignored)."""

    def _close(self) -> None:
        """Release engine-side state of unfinished requests (those of cancelled samples included)."""


AGENT_BACKENDS.register_lazy("native", "verlx.rollout.agent.engine_backends:NativeBackend")
AGENT_BACKENDS.register_lazy("sglang", "verlx.rollout.agent.engine_backends:SGLangBackend")
AGENT_BACKENDS.register_lazy("vllm", "verlx.rollout.agent.engine_backends:VLLMBackend")


def backend_for(engine_name: str):
    """The backend class of a rollout engine, or a clear error for engines that cannot do multi-turn."""
    if engine_name not in AGENT_BACKENDS:
        raise ValueError(
            "the agent-loop rollout (actor_rollout_ref.rollout.mode=async or multi_turn.enable=true) needs an engine "
            f"that takes requests as they come; rollout.name={engine_name} cannot (supported: "
            f"{', '.join(AGENT_BACKENDS.names())}). Use rollout.name=native (needs nothing beyond torch), sglang or "
            "vllm.")
    return AGENT_BACKENDS.get(engine_name)
