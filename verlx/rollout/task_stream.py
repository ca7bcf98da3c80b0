"""A request stream whose requests are coroutines on one event loop (SGLang's in-process engine, and every engine's
HTTP server in server mode): each request a task, a step runs the loop until one finished.

A prompt's samples go as one request with n (the engine prefills the prompt once for all of them; such a group is
cancelled whole). Requests are sent at the next step; cancelling one not sent yet drops it here, the others are
aborted in the engine, and an aborted request comes back with the tokens it had. An engine says how a request is
made (`_request`), how its answer reads (`_finished`) and how requests are aborted (`_abort`).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
from collections.abc import Coroutine

from verlx.rollout.base import SamplingParams
from verlx.rollout.stream import ABORT, Finished, RequestStream, StreamLimits

#: how long a step waits for a request to finish before it returns (an interruption is seen within this)
STEP_WAIT_S = 0.05


class TaskStream(RequestStream):
    def __init__(self, loop: asyncio.AbstractEventLoop, params: SamplingParams, limits: StreamLimits,
                 want_log_probs: bool, prefix: str):
        super().__init__(params, limits, want_log_probs)
        self.loop, self.prefix = loop, prefix
        self._unsent: list[tuple[list[str], list[int], SamplingParams]] = []  # sent to the engine at the next step
        self._tasks: dict[asyncio.Task, list[str]] = {}
        self._aborting: set[str] = set()

    # ------------------------------------------------------------------ what an engine implements
    @abc.abstractmethod
    def _request(self, request_ids: list[str], prompt_ids: list[int], params: SamplingParams) -> Coroutine:
        """The coroutine generating the samples of one prompt (params.n of them, one request id each)."""

    @abc.abstractmethod
    def _finished(self, result, keys: list[str]) -> list[Finished]:
        """A finished request's answer → one Finished per key, in order."""

    @abc.abstractmethod
    def _abort(self, request_ids: list[str], every_running: bool) -> None:
        """Abort these running requests (`every_running`: they are all the stream has running)."""

    # ------------------------------------------------------------------ the stream
    def _submit(self, key, prompt_ids, max_new_tokens, seed, follows) -> None:
        self._queue([key], prompt_ids, max_new_tokens)

    def _submit_samples(self, keys, prompt_ids, max_new_tokens, seeds) -> None:
        self._queue(keys, prompt_ids, max_new_tokens)

    def _queue(self, keys: list[str], prompt_ids: list[int], max_new_tokens: int) -> None:
        self._unsent.append((keys, prompt_ids, dataclasses.replace(self.params, n=len(keys),
                                                                   max_new_tokens=max_new_tokens)))

    def _send(self) -> None:
        for keys, prompt_ids, params in self._unsent:
            request = self._request([self.prefix + key for key in keys], prompt_ids, params)
            self._tasks[self.loop.create_task(request)] = keys
        self._unsent = []

    def _step(self) -> list[Finished]:
        self._send()
        if self._tasks and not self.loop.is_running():
            self.loop.run_until_complete(asyncio.wait(list(self._tasks), timeout=STEP_WAIT_S,
                                                      return_when=asyncio.FIRST_COMPLETED))
        return self._collect()

    async def _progress(self) -> None:
        self._send()
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=STEP_WAIT_S, return_when=asyncio.FIRST_COMPLETED)

    def _collect(self) -> list[Finished]:
        out = []
        for task in [t for t in self._tasks if t.done()]:
            keys = self._tasks.pop(task)
            self._aborting.difference_update(keys)
            out += self._finished(task.result(), keys)
        return out

    def _cancel(self, keys: set[str]) -> list[Finished]:
        unsent = [request for request in self._unsent if keys & set(request[0])]
        self._unsent = [request for request in self._unsent if not keys & set(request[0])]
        dropped = [Finished(key, [], [] if self.want_log_probs else None, ABORT) for group, _, _ in unsent
                   for key in group]
        running = {k for task, ks in self._tasks.items() if not task.done() for k in ks} - self._aborting
        targets = keys & running
        if targets:
            self._abort([self.prefix + key for key in sorted(targets)], targets == running)
            self._aborting |= targets
        return dropped
