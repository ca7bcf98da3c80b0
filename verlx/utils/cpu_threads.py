"""How many CPU threads a training process should use, re-decided as other processes come and go.

OpenMP threads spin while they wait for each other, so running more threads than there are free cores makes every
op wait for a descheduled thread: on a busy 2-core machine, two threads ran the SFT ~6-10x slower than one. The
governor therefore uses this process's share of the cores minus the cores other processes keep busy, measured from
/proc/stat (everything) less this process's own CPU time, and re-measures at every `adjust()`.
"""

from __future__ import annotations

import os
import time

import torch


def _proc_stat() -> tuple[float, float] | None:
    """(total, idle) jiffies of all cores since boot, or None where /proc/stat is unreadable."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
        return float(sum(values)), float(values[3] + values[4])  # idle + iowait
    except (OSError, ValueError, IndexError):
        return None


def _own_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class CpuThreads:
    """Sets torch's intra-op threads now and on every `adjust()`; OMP_NUM_THREADS, when set, fixes them."""

    def __init__(self, probe_s: float = 0.3):
        self.cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        self.share = max(1, self.cores // int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        self.fixed = os.environ.get("OMP_NUM_THREADS", "").isdigit()
        self.busy_elsewhere: float | None = None
        self._mark = self._sample()
        if self.fixed:
            self.threads = max(1, int(os.environ["OMP_NUM_THREADS"]))
        else:
            time.sleep(probe_s)
            self.threads = self._decide()
        torch.set_num_threads(self.threads)

    def _sample(self):
        return _proc_stat(), _own_cpu_seconds(), time.perf_counter()

    def _decide(self) -> int:
        (stat0, own0, wall0), (stat1, own1, wall1) = self._mark, self._sample()
        self._mark = (stat1, own1, wall1)
        if stat0 is None or stat1 is None or wall1 <= wall0:
            return self.share
        total, idle = stat1[0] - stat0[0], stat1[1] - stat0[1]
        busy_all = (os.cpu_count() or 1) * (1.0 - idle / max(total, 1.0))
        self.busy_elsewhere = max(0.0, busy_all - (own1 - own0) / (wall1 - wall0))
        return max(1, min(self.share, self.cores - int(self.busy_elsewhere + 0.5)))

    def adjust(self) -> int:
        """Re-measure since the last call and change the thread count if other load changed."""
        if not self.fixed:
            threads = self._decide()
            if threads != self.threads:
                self.threads = threads
                torch.set_num_threads(threads)
        return self.threads

    def describe(self) -> str:
        if self.fixed:
            return f"{self.threads} thread(s) each (OMP_NUM_THREADS)"
        busy = "" if self.busy_elsewhere is None else f", {self.busy_elsewhere:.1f} busy elsewhere"
        return f"{self.threads} thread(s) each ({self.cores} cores{busy}; re-checked every log step)"


def single_threaded_driver() -> int:
    """One intra-op thread for the trainer's driver process (OMP_NUM_THREADS, when set, decides instead); returns
    the count. The driver's tensors are a step's batch and metrics (advantages, masks, DataProto indexing): more
    threads gain little there, and when another job keeps the host's cores busy every op waits for descheduled
    OpenMP threads — on a loaded 2-core machine the driver's balance + advantage + metrics work on a 512-sample
    batch took 265 ms with 2 threads and 22 ms with one. Ray already runs the workers with OMP_NUM_THREADS=1."""
    if os.environ.get("OMP_NUM_THREADS", "").isdigit():
        return torch.get_num_threads()
    torch.set_num_threads(1)
    return 1
