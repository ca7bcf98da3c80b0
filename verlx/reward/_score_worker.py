"""The scoring process: runs the reward function on the samples the driver sends, one result message each.

Started by verlx.reward.isolation as a fresh interpreter (never a fork of the driver, which runs Ray and torch
threads). It imports only what the reward function needs, so starting or replacing one is quick.
Messages in:  ("init", sys_path, pickled_function), ("run", [(index, kwargs), ...]), None (exit).
Messages out: ("ready", t), ("init_error", traceback), ("result", index, ok, value_or_traceback, t).
Each result carries the worker's monotonic time, which is when its next sample starts (the driver's timeout clock).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from multiprocessing.connection import Connection


def _exit_when_orphaned(parent_pid: int) -> None:
    """A driver that died without closing the pool must not leave scorers spinning forever."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent_pid:
            os._exit(1)


def _describe_unsendable(value, error: Exception) -> str:
    return (
        f"the reward function returned a value that cannot be sent back to the driver "
        f"({type(value).__name__}: {error}); return a float or a dict of plain values"
    )


def serve(fd: int, parent_pid: int) -> None:
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the driver's to handle (sent to the process
        signal.signal(signum, signal.SIG_IGN)  # group by Ctrl-C, `timeout`, a closed terminal); it closes the pool
    threading.Thread(target=_exit_when_orphaned, args=(parent_pid,), daemon=True).start()
    conn = Connection(fd)
    _, sys_path, payload = conn.recv()
    sys.path[:0] = [p for p in sys_path if p not in sys.path]
    try:
        score_fn = pickle.loads(payload)
    except BaseException:
        conn.send(("init_error", traceback.format_exc()))
        return
    conn.send(("ready", time.monotonic()))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            return
        if message is None:
            return
        for index, kwargs in message[1]:
            try:
                reply = ("result", index, True, score_fn(**kwargs))
            except BaseException:
                reply = ("result", index, False, traceback.format_exc())
            try:
                conn.send(reply + (time.monotonic(),))
            except Exception as e:
                conn.send(("result", index, False, _describe_unsendable(reply[3], e), time.monotonic()))
