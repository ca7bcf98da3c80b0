"""The agent loop's connection to an engine's request stream (rollout/stream.py), the same for every engine: each
sample awaits `generate(ids, max_new_tokens, key)` per model turn, and one driver task submits the queued requests,
steps the stream and hands every finished request to its sample, so requests join the engine's running batch as
they come (native: at the next decode round; vLLM: at the next engine step; SGLang: at once, on its own loop).
"""

from __future__ import annotations

import asyncio
import contextlib

from verlx.rollout.seeds import turn_seed
from verlx.rollout.stream import Finished, RequestStream
from verlx.rollout.token_io import EngineGenerationError


class StreamDriver:
    """One batch of samples over one stream; `n` samples per prompt (a request's seed depends on it)."""

    def __init__(self, stream: RequestStream, n: int):
        self.stream, self.n = stream, n
        self._queue: list[tuple[str, list[int], int, int, str | None]] = []
        self._futures: dict[str, asyncio.Future] = {}
        self._last: dict[int, str] = {}  # sample -> its previous request (whose KV the next turn may reuse)
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self.error: BaseException | None = None

    def run(self, make_coro):
        """Run the batch's coroutine where the stream's requests live (its own loop, or a new one)."""
        if self.stream.loop is not None:
            return self.stream.loop.run_until_complete(make_coro())
        return asyncio.run(make_coro())

    async def generate(self, ids: list[int], max_new_tokens: int, key: tuple[int, int]) -> Finished:
        """key: (sample index, turn index): the request's seed and the conversation it continues."""
        if self.error is not None:
            raise RuntimeError(f"the engine failed earlier in this batch: {self.error}") from self.error
        sample, turn = key
        request = f"{sample}/{turn}"
        future = asyncio.get_running_loop().create_future()
        self._futures[request] = future
        self._queue.append((request, list(ids), int(max_new_tokens), turn_seed(self.stream.base_seed, sample, self.n,
                                                                               turn), self._last.get(sample)))
        self._last[sample] = request
        self._wake.set()
        return await future

    async def start(self) -> None:
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._drive())

    async def stop(self) -> None:
        """Stop the driver; requests still out are cancelled and drained from the engine."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.error is None and self.stream.busy:
            self.stream.cancel()
            while self.stream.busy:
                await self.stream.step_async()

    def cut(self) -> None:
        """over_sample_rate: queued requests are never submitted and the engine stops the running ones; their
        samples are being cancelled (a result that still arrives is dropped)."""
        self._queue = []
        pending = set(self._futures)
        self._futures.clear()
        self.stream.cancel(pending)

    async def _drive(self) -> None:
        try:
            while True:
                if not self._queue and not self.stream.busy:
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                queued, self._queue = self._queue, []
                for request, ids, max_new, seed, follows in queued:
                    try:
                        self.stream.submit(request, ids, max_new, seed, follows=follows)
                    except ValueError as e:  # this request is refused; the others go on
                        self._resolve(request, e)
                for finished in await self.stream.step_async():
                    self._resolve(finished.key, finished)
                await asyncio.sleep(0)
        except Exception as e:  # the engine failed: every waiting and later sample gets the error
            self.error = e
            for future in self._futures.values():
                if not future.done():
                    future.set_exception(e)
            self._futures.clear()

    def _resolve(self, request: str, outcome: Finished | Exception) -> None:
        """Hand a request's outcome to its sample, unless that sample was cancelled (over_sample_rate)."""
        future = self._futures.pop(request, None)
        if future is None or future.done():
            return
        if isinstance(outcome, Finished) and not outcome.completed:
            detail = f": {outcome.detail}" if outcome.detail else ""
            outcome = EngineGenerationError(f"the engine did not finish request {request} (finish reason "
                                            f"{outcome.finish_reason!r}){detail}")
        if isinstance(outcome, Exception):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)
