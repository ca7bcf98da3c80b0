"""One error path: every failure a user can cause is a `VerlxError`, and each entry point reports errors in one place
(`reported_errors`).

A VerlxError's text says what failed, where (key, file, row, path) and what to do; it is printed alone, without a
traceback, and the process exits with the error's `exit_code`: 2 for input to fix before running again (config,
data, files), 1 for a run that failed, 128 + N after signal N. Long diagnostics (a worker's traceback) go to a file
whose path the message gives. Any other exception is unexpected: its type and text are printed and its traceback
written to a file, unless VERLX_DEBUG=1, which lets every traceback through as Python prints it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback

logger = logging.getLogger(__name__)

DEBUG_ENV = "VERLX_DEBUG"
ERROR_DIR_ENV = "VERLX_ERROR_DIR"


class VerlxError(Exception):
    """A failure verlx explains: the message names what, where and what to do; `exit_code` is the process's."""

    exit_code = 1

    def summary(self) -> str:
        """What the terminal shows."""
        return str(self)

    def details(self) -> str | None:
        """Long diagnostics (a remote traceback) that go to a file instead of the terminal; None when there are none."""
        return None


class InputError(VerlxError):
    """Input the user fixes before running again: the config, the data, a model or reward file, the environment."""

    exit_code = 2


class StorageError(VerlxError):
    """Writing a checkpoint, metrics or a dump failed: the path, the OS error and what to do."""

    @classmethod
    def writing(cls, what: str, path: str, error: BaseException, remedy: str = "") -> StorageError:
        """'cannot write <what> <path>: <OS error>; <free space> free on that file system. <remedy>'."""
        text = f"cannot write {what} {path}: {describe_os_error(error)}; {free_space(path)} free on that file system"
        return cls(f"{text}. {remedy}" if remedy else f"{text}.")


# How torch's file writer reports a write that came up short (a full disk, a quota): no errno survives.
TORCH_SHORT_WRITE = ("unexpected pos", "file write failed", "PytorchStreamWriter failed")


def is_storage_error(error: BaseException) -> bool:
    """An OS error, or torch's writer failing, anywhere in the exception's chain."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) or (isinstance(seen, RuntimeError) and
                                         any(marker in str(seen) for marker in TORCH_SHORT_WRITE)):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def describe_os_error(error: BaseException) -> str:
    """'No space left on device (ENOSPC)' for an OS error; for torch's writer, what its message means."""
    if isinstance(error, OSError) and error.errno is not None:
        name = errno.errorcode.get(error.errno, str(error.errno))
        return f"{error.strerror or os.strerror(error.errno)} ({name})"
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if any(marker in text for marker in TORCH_SHORT_WRITE):
        return f"a write came up short ({text}), as it does when the disk is full or a quota is reached"
    return f"{type(error).__name__}: {text}"


@contextlib.contextmanager
def storage_errors(what: str, path: str, remedy: str = ""):
    """A failed write inside (an OS error, torch's writer coming up short) becomes StorageError naming `what`, `path`,
    the OS error and the free space."""
    try:
        yield
    except VerlxError:
        raise
    except Exception as e:
        if not is_storage_error(e):
            raise
        raise StorageError.writing(what, path, e, remedy) from e


def free_space(path: str) -> str:
    """The free space of the file system holding `path` (or its nearest existing parent), e.g. '12.0 MiB'."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return "unknown space"
    return f"{free / 2**20:.1f} MiB"


def debug_enabled() -> bool:
    return os.environ.get(DEBUG_ENV, "").strip().lower() in ("1", "true", "yes")


def write_details(text: str) -> str | None:
    """Write `text` to a fresh file under $VERLX_ERROR_DIR (default: <tmp>/verlx-errors); its path, or None."""
    directory = os.environ.get(ERROR_DIR_ENV) or os.path.join(tempfile.gettempdir(), "verlx-errors")
    path = os.path.join(directory, f"error-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt")
    try:
        os.makedirs(directory, exist_ok=True)
        with open(path, "w") as f:
            f.write(text)
    except OSError:
        return None
    return path


def _print(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _raised_by_a_signal_handler(error: BaseException) -> BaseException:
    """A signal handler's exception (verlx's Interrupted, Python's KeyboardInterrupt) raised while a C extension
    checked for signals comes back as that extension's SystemError ("... returned a result with an exception set"),
    caused by it: Ray's ray.wait, where the driver spends most of its time. The handler's exception is the error."""
    while isinstance(error, SystemError) and isinstance(error.__cause__, (VerlxError, KeyboardInterrupt)):
        error = error.__cause__
    return error


def report(error: BaseException) -> int:
    """Print `error` as verlx reports it; the exit code."""
    error = _raised_by_a_signal_handler(error)
    if isinstance(error, VerlxError):
        message = f"error: {error.summary()}"
        details = error.details()
        if details:
            path = write_details(details)
            message += f"\n(the full traceback is in {path}; {DEBUG_ENV}=1 prints it here)" if path else f"\n{details}"
        _print(message)
        return error.exit_code
    if isinstance(error, KeyboardInterrupt):
        _print("interrupted (SIGINT)")
        return 130
    text = "".join(traceback.format_exception(error))
    path = write_details(text)
    where = f"the traceback is in {path}" if path else "no file could be written for the traceback"
    _print(f"error: {type(error).__name__}: {error}\n(unexpected: {where}; {DEBUG_ENV}=1 prints it here. If your "
           "input is fine, please report it with that file)")
    return 1


@contextlib.contextmanager
def reported_errors():
    """Catch everything once at an entry point: a message and an exit code instead of a traceback (VERLX_DEBUG=1
    lets tracebacks through). SystemExit passes unchanged."""
    try:
        yield
    except SystemExit:
        raise
    except BaseException as e:
        if debug_enabled():
            raise
        code = report(e)
        raise SystemExit(code) from None


@contextlib.contextmanager
def input_errors(phase: str):
    """Within `phase` (checking and loading the user's input, before any worker starts) every failure is about that
    input: Python's own exception types become InputError (exit 2) with the message they carry and the traceback in
    its details."""
    try:
        yield
    except VerlxError:
        raise
    except (ValueError, TypeError, KeyError, AttributeError, ImportError, OSError, LookupError) as e:
        raise _InputFailure(phase, e) from e


class _InputFailure(InputError):
    def __init__(self, phase: str, error: BaseException):
        text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
        super().__init__(f"{text} ({phase}; {type(error).__name__})")
        self._traceback = "".join(traceback.format_exception(error))

    def details(self) -> str | None:
        return self._traceback
