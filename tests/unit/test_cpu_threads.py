"""The CPU thread governor: share of the cores less what other processes use, from /proc/stat-style counters."""

from __future__ import annotations

import pytest
import torch

from verlx.utils import cpu_threads
from verlx.utils.cpu_threads import CpuThreads


@pytest.fixture
def machine(monkeypatch):
    """A 4-core machine whose /proc/stat counters, own CPU time and clock the test advances by hand."""
    state = {"total": 0.0, "idle": 0.0, "own": 0.0, "wall": 0.0}
    monkeypatch.setattr(cpu_threads.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})
    monkeypatch.setattr(cpu_threads.os, "cpu_count", lambda: 4)
    monkeypatch.setattr(cpu_threads, "_proc_stat", lambda: (state["total"], state["idle"]))
    monkeypatch.setattr(cpu_threads, "_own_cpu_seconds", lambda: state["own"])
    monkeypatch.setattr(cpu_threads.time, "perf_counter", lambda: state["wall"])
    monkeypatch.setattr(cpu_threads.time, "sleep", lambda s: None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    before = torch.get_num_threads()

    def advance(seconds: float, busy_cores: float, own_cores: float) -> None:
        """`seconds` pass with `busy_cores` of the 4 busy in all, `own_cores` of them this process."""
        state["wall"] += seconds
        state["total"] += 4 * seconds * 100  # 100 jiffies per core-second
        state["idle"] += (4 - busy_cores) * seconds * 100
        state["own"] += own_cores * seconds

    yield advance
    torch.set_num_threads(before)


def test_threads_follow_the_cores_others_leave_free(machine):
    gov = CpuThreads()  # the probe saw nothing (no time passed): all 4 cores
    assert gov.threads == 4 and torch.get_num_threads() == 4
    machine(10, busy_cores=4.0, own_cores=2.4)  # others took 1.6 cores → 4 - round(1.6) = 2
    assert gov.adjust() == 2 and torch.get_num_threads() == 2
    assert gov.busy_elsewhere == pytest.approx(1.6)
    machine(10, busy_cores=2.0, own_cores=2.0)  # others left: all 4 again
    assert gov.adjust() == 4
    machine(10, busy_cores=4.0, own_cores=0.0)  # everything busy elsewhere: never fewer than 1
    assert gov.adjust() == 1


def test_share_of_a_torchrun_node_and_omp_override(machine, monkeypatch):
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    gov = CpuThreads()
    assert gov.threads == 2  # 4 cores / 2 processes
    machine(10, busy_cores=4.0, own_cores=2.0)  # the sibling process uses its 2 cores: still 2 each
    assert gov.adjust() == 2
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    fixed = CpuThreads()
    machine(10, busy_cores=4.0, own_cores=0.0)
    assert fixed.threads == 3 and fixed.adjust() == 3 and "OMP_NUM_THREADS" in fixed.describe()


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_the_ppo_driver_runs_one_intra_op_thread_unless_omp_num_threads_says(monkeypatch, threads_restored):
    """On a host another job keeps busy, the driver's small tensor ops waited for descheduled OpenMP threads
    (12x slower with 2 threads than with 1 on a loaded 2-core machine): run_ppo takes one thread before anything."""
    from verlx.trainer import main_ppo

    seen = []

    def stop(config):
        seen.append(torch.get_num_threads())
        raise RuntimeError("stopped after the thread setting")

    monkeypatch.setattr(main_ppo, "prepare", stop)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    with pytest.raises(RuntimeError, match="stopped after"):
        main_ppo.run_ppo(None)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    torch.set_num_threads(2)
    with pytest.raises(RuntimeError, match="stopped after"):
        main_ppo.run_ppo(None)
    assert seen == [1, 2]
