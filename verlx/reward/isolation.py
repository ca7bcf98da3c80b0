"""A pool of scoring processes with a per-sample timeout: a reward function that hangs, crashes or loops
forever costs one sample (scored as failed) and one process (killed and replaced), never the run.

Workers are fresh interpreters started once (see _score_worker.py) and reused across steps. Samples go out
in chunks (few messages per step); results come back one per sample, so the driver always knows which sample
a worker is on and since when. A sample that runs far longer than samples usually take is left alone on its
process while a fresh process takes over the queue behind it, so stuck samples wait out their timeouts side by side.
"""

from __future__ import annotations

import collections
import math
import os
import pickle
import subprocess
import sys
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing import Pipe
from multiprocessing.connection import Connection, wait
from typing import Any

import verlx
from verlx.utils.errors import VerlxError

_VERLX_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(verlx.__file__)))
_WORKER_MAIN = "import sys; from verlx.reward._score_worker import serve; serve(int(sys.argv[1]), int(sys.argv[2]))"
# Libraries inside reward functions must not start one thread per core in every scoring process.
_THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")
MAX_CHUNK = 64
# A sample is suspected stuck once it has run HEDGE_FACTOR times longer than the slowest recent sample, but never
# sooner than HEDGE_MIN_S (a scheduling hiccup) nor later than a quarter of the timeout. "Recent" fades by
# HEDGE_DECAY per finished sample, so one slow sample does not slow the hand-over for the rest of the run.
HEDGE_FACTOR = 10.0
HEDGE_MIN_S = 0.1
HEDGE_DECAY = 0.99
# Stuck samples that may wait out their timeouts at once (at least): a whole GRPO group of 16 that hangs costs one
# timeout. Each is an idle or spinning process until its timeout kills it.
MIN_STRAGGLERS = 16


@dataclass
class ScoreOutcome:
    """What happened to one sample: status is ok, error, timeout or aborted (batch given up)."""

    status: str
    value: Any = None
    traceback: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class WorkerStartError(VerlxError, RuntimeError):
    """A scoring process could not load the reward function."""


def serialize_score_function(fn: Callable) -> bytes:
    """Pickle by reference when possible, by value (cloudpickle, if installed) otherwise."""
    try:
        return pickle.dumps(fn)
    except Exception as first_error:
        try:
            import cloudpickle

            return cloudpickle.dumps(fn)
        except Exception:
            pass
        raise TypeError(
            f"the reward function {fn!r} cannot be sent to the scoring processes ({first_error}). Define it at "
            "module level in an importable module, load it from a file with custom_reward_function.path, or set "
            "reward.num_workers=0 to score in the driver (no timeout)."
        ) from first_error


class _Worker:
    """One scoring process and the chunk of sample indices it is working through."""

    def __init__(self, payload: bytes):
        parent_conn, child_conn = Pipe(duplex=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in [_VERLX_ROOT, env.get("PYTHONPATH", "")] if p)
        for key in _THREAD_ENV:
            env.setdefault(key, "1")
        fd = child_conn.fileno()
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _WORKER_MAIN, str(fd), str(os.getpid())], pass_fds=(fd,), env=env, close_fds=True
        )
        child_conn.close()
        self.conn: Connection = parent_conn
        self.conn.send(("init", list(sys.path), payload))
        self.ready = False
        self.straggler = False
        self.chunk: list[int] = []
        self.position = 0
        self.started_at = time.monotonic()

    @property
    def busy(self) -> bool:
        return self.position < len(self.chunk)

    @property
    def current(self) -> int:
        return self.chunk[self.position]

    def assign(self, chunk: list[int], calls: Sequence[dict]) -> None:
        self.chunk, self.position = chunk, 0
        if self.ready:
            self.started_at = time.monotonic()
        self.conn.send(("run", [(i, calls[i]) for i in chunk]))

    def take_back(self, keep_current: bool = False) -> list[int]:
        """The not-yet-started rest of the chunk (after the current sample); the chunk ends with the current
        sample when `keep_current`, else it is emptied."""
        rest = self.chunk[self.position + 1 :]
        self.chunk = self.chunk[: self.position + 1] if keep_current else []
        if not keep_current:
            self.position = 0
        return rest

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.conn.close()

    def stop(self) -> None:
        """Ask an idle worker to exit; kill it if it does not."""
        try:
            self.conn.send(None)
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.kill()


def _kill_all(*groups: list) -> None:
    """Finalizer: no scoring process outlives the pool object (or the interpreter)."""
    for group in groups:
        for w in group:
            if w is not None:
                w.kill()


class ScorePool:
    """`num_workers` scoring processes running `score_fn(**call)` with `timeout_s` per call.

    A sample that runs past `hedge_after_s` makes its process a straggler: it keeps only that sample until it
    finishes or times out, while a fresh process takes its place and the rest of its chunk. So stuck samples wait
    out their timeouts side by side (up to `max_stragglers` at once) and a batch with a few of them takes about one
    timeout, not one per stuck sample, even when they sit next to each other in one chunk. By default
    `hedge_after_s` follows how long samples take (HEDGE_FACTOR × the slowest recent one, within HEDGE_MIN_S and
    a quarter of the timeout): a stuck sample among millisecond ones is handed over within a fraction of a
    second, while a reward that legitimately takes seconds per sample is not churned through fresh processes.
    """

    def __init__(
        self,
        score_fn: Callable,
        num_workers: int,
        timeout_s: float,
        hedge_after_s: float | None = None,
        max_stragglers: int | None = None,
        start_timeout_s: float = 120.0,
    ):
        if num_workers < 1:
            raise ValueError(f"ScorePool needs num_workers >= 1 (reward.num_workers), got {num_workers}")
        if not timeout_s > 0:
            raise ValueError(f"reward.timeout_s must be > 0, got {timeout_s}")
        self.timeout_s = float(timeout_s)
        self.fixed_hedge_after_s = None if hedge_after_s is None else float(hedge_after_s)
        self._slowest_recent_s: float | None = None  # none finished yet: hand over only after a quarter timeout
        self.max_stragglers = max(MIN_STRAGGLERS, 4 * num_workers) if max_stragglers is None else int(max_stragglers)
        self.start_timeout_s = float(start_timeout_s)
        self.replacements = 0
        self._payload = serialize_score_function(score_fn)
        self._workers: list[_Worker | None] = [_Worker(self._payload) for _ in range(num_workers)]
        self._stragglers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self._workers, self._stragglers)
        self._await_ready()

    def _await_ready(self) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        for w in self._workers:
            while not w.ready:
                if not w.conn.poll(max(deadline - time.monotonic(), 0)):
                    self.close()
                    raise WorkerStartError(f"a reward scoring process did not start within {self.start_timeout_s:.0f}s")
                self._handle_message(w, None)

    # ------------------------------------------------------------------ one batch
    def map(self, calls: Sequence[dict], max_failures: int | None = None) -> list[ScoreOutcome]:
        """Score every call; stop early (rest 'aborted') once more than `max_failures` have failed."""
        if not self._finalizer.alive:
            raise RuntimeError("this ScorePool was closed")
        outcomes: list[ScoreOutcome | None] = [None] * len(calls)
        pending = collections.deque(range(len(calls)))
        chunk_size = max(1, min(MAX_CHUNK, math.ceil(len(calls) / (4 * len(self._workers)))))
        remaining, failures = len(calls), 0

        def record(finished: tuple[int, ScoreOutcome] | None) -> None:
            nonlocal remaining, failures
            if finished is not None:
                outcomes[finished[0]] = finished[1]
                remaining -= 1
                failures += not finished[1].ok

        try:
            while remaining and (max_failures is None or failures <= max_failures):
                self._assign(pending, chunk_size, calls)
                busy = [w for w in self._workers if w is not None and w.busy] + self._stragglers
                wake_at = min(min(self._deadline(w), self._hedge_time(w, pending)) for w in busy)
                for conn in wait([w.conn for w in busy], timeout=max(wake_at - time.monotonic(), 0)):
                    w = next(w for w in busy if w.conn is conn)
                    record(self._handle_message(w, pending))
                    while w.busy and w.conn.poll():
                        record(self._handle_message(w, pending))
                now = time.monotonic()
                for w in busy:
                    if w.busy and now >= self._deadline(w):
                        record(self._expire(w, pending))
                    elif w.busy and now >= self._hedge_time(w, pending):
                        self._make_straggler(w, pending)
        finally:
            if self._stragglers or any(w is not None and w.busy for w in self._workers):
                self._reset_busy()
        return [o or ScoreOutcome("aborted", traceback="batch given up after too many failures") for o in outcomes]

    def _assign(self, pending: collections.deque, chunk_size: int, calls: Sequence[dict]) -> None:
        for slot, w in enumerate(self._workers):
            if not pending:
                return
            if w is not None and not w.busy and w.proc.poll() is not None:  # died while idle
                w.kill()
                w = self._workers[slot] = None
            if w is None:
                w = self._workers[slot] = _Worker(self._payload)
                self.replacements += 1
            if not w.busy:
                w.assign([pending.popleft() for _ in range(min(chunk_size, len(pending)))], calls)

    def _deadline(self, w: _Worker) -> float:
        return w.started_at + self.timeout_s + (0.0 if w.ready else self.start_timeout_s)

    @property
    def hedge_after_s(self) -> float:
        """How long a sample may run before the samples queued behind it move to a fresh process."""
        if self.fixed_hedge_after_s is not None:
            return self.fixed_hedge_after_s
        longest = self.timeout_s / 4
        if self._slowest_recent_s is None:
            return longest
        return min(max(HEDGE_FACTOR * self._slowest_recent_s, HEDGE_MIN_S), longest)

    def _hedge_time(self, w: _Worker, pending: collections.deque) -> float:
        """When `w` should hand its queue to a fresh process (never, if nothing waits on it)."""
        if w.straggler or not w.ready or len(self._stragglers) >= self.max_stragglers:
            return math.inf
        if not pending and w.position + 1 >= len(w.chunk):
            return math.inf
        return w.started_at + self.hedge_after_s

    def _make_straggler(self, w: _Worker, pending: collections.deque) -> None:
        pending.extendleft(reversed(w.take_back(keep_current=True)))
        w.straggler = True
        self._workers[self._workers.index(w)] = None
        self._stragglers.append(w)

    def _handle_message(self, w: _Worker, pending: collections.deque | None) -> tuple[int, ScoreOutcome] | None:
        """Read one message from `w`; a finished sample comes back as (index, outcome)."""
        try:
            message = w.conn.recv()
        except (EOFError, OSError):
            return self._died(w, pending)
        kind = message[0]
        if kind == "ready":
            w.ready, w.started_at = True, message[1]
            return None
        if kind == "init_error":
            self.close()
            raise WorkerStartError(
                "a reward scoring process could not load the reward function (a function defined in a script's "
                "__main__ cannot be loaded there: move it into a module or a file named by "
                f"custom_reward_function.path):\n{message[1]}"
            )
        _, index, ok, value, finished_at = message
        took = finished_at - w.started_at
        recent = self._slowest_recent_s
        self._slowest_recent_s = took if recent is None else max(took, recent * HEDGE_DECAY)
        w.position += 1
        w.started_at = finished_at
        if w.straggler and not w.busy:
            self._discard(w)
        return index, ScoreOutcome("ok", value) if ok else ScoreOutcome("error", traceback=value)

    def _discard(self, w: _Worker, pending: collections.deque | None = None) -> None:
        """Kill `w` and free its place; the not-yet-started rest of its chunk goes back to `pending`."""
        if pending is not None:
            pending.extendleft(reversed(w.take_back()))
        w.kill()
        if w.straggler:
            self._stragglers.remove(w)
        else:
            self._workers[self._workers.index(w)] = None

    def _died(self, w: _Worker, pending) -> tuple[int, ScoreOutcome] | None:
        code = w.proc.wait()
        if not w.ready or not w.busy:
            self.close()
            raise WorkerStartError(f"a reward scoring process exited (code {code}) before it could score anything")
        index = w.current
        self._discard(w, pending)
        return index, ScoreOutcome(
            "error", traceback=f"the scoring process exited with code {code} while scoring this sample"
        )

    def _expire(self, w: _Worker, pending: collections.deque) -> tuple[int, ScoreOutcome]:
        index = w.current
        self._discard(w, pending)
        return index, ScoreOutcome(
            "timeout",
            traceback=f"timed out after {self.timeout_s:g}s (reward.timeout_s); the scoring process was killed "
            "and replaced",
        )

    def _reset_busy(self) -> None:
        """Processes still on an abandoned batch are killed; fresh ones start when next needed."""
        for w in [w for w in self._workers if w is not None and w.busy] + self._stragglers:
            self._discard(w)

    # ------------------------------------------------------------------ lifetime
    @property
    def num_workers(self) -> int:
        return len(self._workers)

    def close(self) -> None:
        for w in list(self._stragglers):
            self._discard(w)
        for slot, w in enumerate(self._workers):
            if w is not None:
                if w.busy or not w.ready:
                    w.kill()
                else:
                    w.stop()
                self._workers[slot] = None
        self._finalizer.detach()

    def __enter__(self) -> ScorePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
