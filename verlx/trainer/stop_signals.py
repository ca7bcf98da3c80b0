"""Stopping on SIGTERM, SIGINT and SIGHUP (what schedulers, `timeout`, Ctrl-C and a closed terminal send).

The first signal during training asks the loop to stop at its next safe point: the running step finishes, a
checkpoint is saved (trainer.save_on_signal) and the process exits with 128 + the signal's number; resuming
continues from that checkpoint exactly. If no safe point is reached within trainer.save_on_signal_timeout_s, or a
second signal arrives, or the first one comes outside the step loop (start-up, or save_on_signal=false), the run
stops at once and the message names the last complete checkpoint. Either way the workers, the reward processes and
the Ray instance are stopped by the normal shutdown path before the process exits.
"""

from __future__ import annotations

import _thread
import contextlib
import logging
import signal
import threading
from collections.abc import Callable, Iterator

from verlx.utils.errors import VerlxError

logger = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Interrupted(VerlxError):
    """The run stopped on a signal; the exit code is the shell's for a death by that signal, 128 + its number."""

    def __init__(self, signum: int, message: str):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def signal_name(signum: int) -> str:
    return signal.Signals(signum).name


class StopSignals:
    """The driver's handlers for STOP_SIGNALS, installed while the object is entered (in the main thread)."""

    def __init__(self, save: bool, timeout_s: float | None, last_checkpoint: Callable[[], str]):
        """`save`: stop at the next safe point with a checkpoint; `timeout_s`: how long that may take;
        `last_checkpoint()`: a sentence naming the newest complete checkpoint."""
        self.save = save
        self.timeout_s = timeout_s
        self.last_checkpoint = last_checkpoint
        self.signum: int | None = None
        self._in_loop = False
        self._deadline_passed = False
        self._timer: threading.Timer | None = None
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            for signum in STOP_SIGNALS:
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous.clear()

    @contextlib.contextmanager
    def step_loop(self) -> Iterator[None]:
        """While inside, a first signal waits for the loop's next safe point (stop_point) instead of stopping."""
        self._in_loop = True
        try:
            yield
        finally:
            self._in_loop = False

    def _handle(self, signum: int, frame) -> None:
        name = signal_name(signum)
        if self._deadline_passed:
            raise Interrupted(signum, f"stopped on {name}: no safe point was reached within "
                              f"trainer.save_on_signal_timeout_s={self.timeout_s:g}s, so no checkpoint was saved. "
                              f"{self.last_checkpoint()}")
        if self.signum is not None:
            raise Interrupted(signum, f"stopped at once on a second signal ({name}); the save that "
                              f"{signal_name(self.signum)} asked for did not happen. {self.last_checkpoint()}")
        if not (self.save and self._in_loop):
            why = "" if self.save else " (trainer.save_on_signal=false)"
            raise Interrupted(signum, f"stopped on {name}{why}. {self.last_checkpoint()}")
        self.signum = signum
        bound = f" within trainer.save_on_signal_timeout_s={self.timeout_s:g}s" if self.timeout_s else ""
        logger.warning("%s received: finishing the running step, then saving a checkpoint and stopping%s; send a "
                       "signal again to stop at once without saving", name, bound)
        if self.timeout_s:
            self._timer = threading.Timer(self.timeout_s, self._deadline, (signum,))
            self._timer.daemon = True
            self._timer.start()

    def _deadline(self, signum: int) -> None:
        self._deadline_passed = True
        _thread.interrupt_main(signum)

    def stop_point(self, step: int, saved: str | None, save: Callable[[], str]) -> None:
        """The loop's safe point after `step`: if a signal asked to stop, raise Interrupted naming the checkpoint of
        this step, `saved`, or the one `save()` writes (the signal came after the step's save point)."""
        if self.signum is None:
            return
        path = saved or save()
        if self._timer is not None:
            self._timer.cancel()
        raise Interrupted(self.signum, f"stopped on {signal_name(self.signum)} after step {step}: its checkpoint is "
                          f"{path}. Run the same command again to resume from it (trainer.resume_mode=auto)")


@contextlib.contextmanager
def stop_at_once(consequence: str = "") -> Iterator[None]:
    """A command's handlers outside a step loop: any of STOP_SIGNALS stops it at once through the error path (its
    `finally` clean-ups run, the message says `consequence`, the exit code is 128 + the signal) instead of Python's
    silent death on SIGTERM and SIGHUP. Only in the main thread, where handlers can be installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame) -> None:
        raise Interrupted(signum, f"stopped on {signal_name(signum)}{consequence}")

    previous = {signum: signal.signal(signum, stop) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@contextlib.contextmanager
def signals_blocked_in_children(signums) -> Iterator[None]:
    """Processes (and threads) started inside inherit `signums` blocked: a signal to the whole process group
    reaches only the driver, which decides when they stop. SIGKILL still ends them, and each of Ray's exits when
    its parent's connection goes."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, signums)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


class NoStopSignals(StopSignals):
    """For trainers driven by code (tests, notebooks): signals keep Python's default behaviour."""

    def __init__(self):
        super().__init__(save=False, timeout_s=None, last_checkpoint=lambda: "")

    def __enter__(self) -> StopSignals:
        return self
