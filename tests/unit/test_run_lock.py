"""One run per checkpoint directory (verlx.trainer.run_lock): a live holder is named and refused, a dead one is
taken over with a message, another host's lock only once it stopped being refreshed."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import time

import pytest

from verlx.trainer import run_lock
from verlx.trainer.run_lock import LOCK_NAME, DirectoryInUse, RunLock


def write_lock(directory, **fields) -> str:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, LOCK_NAME)
    holder = {"pid": 1, "host": socket.gethostname(), "process_start": None, "started": "2026-11-26 08:00:00 +0000",
              "command": "python -m verlx.trainer.main_ppo a=b", **fields}
    with open(path, "w") as f:
        json.dump(holder, f)
    return path


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_second_run_is_refused_naming_the_first(tmp_path):
    with RunLock(str(tmp_path)):
        with pytest.raises(DirectoryInUse) as info:
            RunLock(str(tmp_path)).acquire()
    assert str(info.value).startswith(f"trainer.default_local_dir={tmp_path} is in use by another run: pid "
                                      f"{os.getpid()} on host {socket.gethostname()}, started ")
    assert info.value.exit_code == 2
    assert not os.path.exists(tmp_path / LOCK_NAME)  # released on exit
    RunLock(str(tmp_path)).acquire().release()  # and free again


def test_a_lock_whose_process_is_gone_is_taken_over_with_a_message(tmp_path, caplog):
    pid = dead_pid()
    write_lock(tmp_path, pid=pid)
    with caplog.at_level(logging.WARNING), RunLock(str(tmp_path)) as lock:
        with open(lock.path) as f:
            assert json.load(f)["pid"] == os.getpid()
    assert (f"trainer.default_local_dir: taking over the lock of pid {pid} on host {socket.gethostname()}, started "
            "2026-11-26 08:00:00 +0000 (python -m verlx.trainer.main_ppo a=b), which is no longer running"
            ) in caplog.text


def test_a_reused_pid_is_not_mistaken_for_the_holder(tmp_path):
    write_lock(tmp_path, pid=os.getpid(), process_start="1")  # this pid, but a process that started at another time
    RunLock(str(tmp_path)).acquire().release()


def test_another_hosts_lock_holds_until_it_goes_stale(tmp_path, monkeypatch):
    path = write_lock(tmp_path, pid=os.getpid(), host="elsewhere")
    with pytest.raises(DirectoryInUse, match=f"pid {os.getpid()} on host elsewhere"):
        RunLock(str(tmp_path)).acquire()
    old = time.time() - run_lock.STALE_AFTER_S - 1
    os.utime(path, (old, old))
    RunLock(str(tmp_path)).acquire().release()


def test_the_holder_refreshes_its_lock(tmp_path, monkeypatch):
    monkeypatch.setattr(run_lock, "HEARTBEAT_S", 0.05)
    with RunLock(str(tmp_path)) as lock:
        os.utime(lock.path, (0, 0))
        time.sleep(0.5)
        assert time.time() - os.path.getmtime(lock.path) < 5
