"""One run per checkpoint directory: a lock file in trainer.default_local_dir naming the run that holds it.

Two runs on one directory would resume from each other's checkpoints, overwrite them and delete each other's
unfinished saves. The second run is refused before Ray starts, naming the first (pid, host, start time, command).
A lock whose holder is gone is taken over with a message: on this host when its process no longer exists; from
another host when it has not been refreshed for STALE_AFTER_S (the holder touches it every HEARTBEAT_S).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import sys
import threading
import time

from verlx.utils.errors import InputError

logger = logging.getLogger(__name__)

LOCK_NAME = "verlx_run.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 120.0
_TAKEOVER_ATTEMPTS = 3


class DirectoryInUse(InputError):
    """Another live run holds the lock of this checkpoint directory."""


def _process_start(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (Linux), telling a reused pid from the holder."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return started is None or _process_start(pid) in (None, started)


def _read(path: str) -> dict | None:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


class RunLock:
    """Held from acquire() to release(); `key` names the directory's config key in messages."""

    def __init__(self, directory: str, key: str = "trainer.default_local_dir"):
        self.directory = directory
        self.key = key
        self.path = os.path.join(directory, LOCK_NAME)
        self.info = {"pid": os.getpid(), "host": socket.gethostname(), "process_start": _process_start(os.getpid()),
                     "started": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": " ".join(sys.argv)}
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None

    def acquire(self) -> RunLock:
        os.makedirs(self.directory, exist_ok=True)
        for _ in range(_TAKEOVER_ATTEMPTS):
            if self._create():
                self._heartbeat = threading.Thread(target=self._beat, name="verlx-run-lock", daemon=True)
                self._heartbeat.start()
                return self
            holder = _read(self.path)
            if holder is None and self._age() < STALE_AFTER_S:
                time.sleep(0.2)  # being written by its holder right now
                continue
            if holder is not None and self._held_by_live_run(holder):
                raise DirectoryInUse(self._refusal(holder))
            self._take_over(holder)
        raise DirectoryInUse(f"{self.key}={self.directory}: could not take the lock {self.path} (other runs keep "
                             "taking it); start one run per directory")

    def release(self) -> None:
        self._stop.set()
        holder = _read(self.path)
        if holder is not None and holder.get("pid") == self.info["pid"] and holder.get("host") == self.info["host"]:
            with contextlib.suppress(OSError):
                os.remove(self.path)

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump(self.info, f)
        return True

    def _age(self) -> float:
        try:
            return time.time() - os.path.getmtime(self.path)
        except OSError:
            return 0.0

    def _held_by_live_run(self, holder: dict) -> bool:
        if holder.get("host") == self.info["host"]:
            return _alive(int(holder.get("pid", -1)), holder.get("process_start"))
        return self._age() < STALE_AFTER_S

    def _take_over(self, holder: dict | None) -> None:
        """Move the stale lock aside (one contender wins the rename) and say whose it was."""
        aside = f"{self.path}.stale-{os.getpid()}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return
        if _read(aside) != holder:  # another run took it over in between: put its lock back
            with contextlib.suppress(OSError):
                os.rename(aside, self.path)
            return
        os.remove(aside)
        if holder is None:
            logger.warning("%s: removed an unreadable lock file %s, untouched for %.0fs", self.key, self.path,
                           STALE_AFTER_S)
        else:
            logger.warning("%s: taking over the lock of %s, which is no longer running", self.key, _describe(holder))

    def _refusal(self, holder: dict) -> str:
        return (f"{self.key}={self.directory} is in use by another run: {_describe(holder)}. Two runs on one "
                "checkpoint directory would resume from and overwrite each other's checkpoints. Wait for it to finish "
                f"or stop it, or give this run another {self.key} (or trainer.experiment_name). If that run is gone "
                f"and its machine cannot be checked, delete {self.path}")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            with contextlib.suppress(OSError):
                os.utime(self.path)


def _describe(holder: dict) -> str:
    return (f"pid {holder.get('pid')} on host {holder.get('host')}, started {holder.get('started')} "
            f"({holder.get('command', '')[:200]})")
