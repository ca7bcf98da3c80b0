"""Running a verlx command in a session of its own, signalling it mid-run and counting what it left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from helpers.commands import REPO_DIR


def start_in_own_session(module: str, args: list[str], cwd) -> subprocess.Popen:
    """`python -m module args` as the leader of a new session: every process it starts (Ray's, the reward
    scorers) stays in that session, so they can be counted after it exits."""
    tests_dir = os.path.join(REPO_DIR, "tests")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_DIR, tests_dir]), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", module, *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)


def session_processes(session: int) -> list[int]:
    """The live (not zombie) processes of a session."""
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == session and fields[0] != "Z":
            pids.append(int(name))
    return pids


def wait_for_lines(path: str, count: int, proc: subprocess.Popen, timeout_s: float = 240) -> None:
    """Until the file at `path` has `count` lines (a metrics row per step), failing if the process ends first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if os.path.exists(path):
            with open(path) as f:
                if f.read().count("\n") >= count:
                    return
        assert proc.poll() is None, proc.communicate()[0][-4000:]
        time.sleep(0.1)
    raise AssertionError(f"{path} did not reach {count} lines in {timeout_s}s")


def send(proc: subprocess.Popen, *signums: int, to_group: bool = False) -> None:
    """Send each signal in turn (to the process, or to its whole process group as `timeout` and a terminal do)."""
    for signum in signums:
        if to_group:
            os.killpg(proc.pid, signum)
        else:
            os.kill(proc.pid, signum)


def wait_gone(session: int, timeout_s: float = 20) -> list[int]:
    """The session's processes still alive after `timeout_s` (empty when they all went in time)."""
    deadline = time.monotonic() + timeout_s
    while session_processes(session) and time.monotonic() < deadline:
        time.sleep(0.2)
    return session_processes(session)


__all__ = ["send", "session_processes", "start_in_own_session", "wait_for_lines", "wait_gone"]
