"""Resident device memory of a phase across ranks (the TP memory-imbalance check): phase_metrics reports the
largest rank's footprint, (max - min) / max, the rank holding the most and how the spread splits between the
worker's own allocator and the rest, over a real 3-rank gloo group; on the CPU (no reading) none of them."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verlx.metrics.phases import (
    IMBALANCE_PREFIX,
    MEMORY_PREFIX,
    MOST_RANK_PREFIX,
    OTHERS_IMBALANCE_PREFIX,
    OWN_IMBALANCE_PREFIX,
    USED_PREFIX,
    phase_metrics,
)
from verlx.workers.perf import PhaseTimer

GIB = 2**30
USED_BY_RANK = (8 * GIB, 10 * GIB, 9 * GIB)  # what every process holds on each rank's GPU
OWN_BY_RANK = (6 * GIB, 6 * GIB, 5 * GIB)  # of which the worker's own allocator reserves this
PEAK_BY_RANK = (3 * GIB, 2 * GIB, 4 * GIB)


def _rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=len(USED_BY_RANK))
    timer = PhaseTimer(torch.device("cpu"), "gen", rank)
    timer.device_used_bytes, timer.own_reserved_bytes = USED_BY_RANK[rank], OWN_BY_RANK[rank]
    timer.peak_bytes = PEAK_BY_RANK[rank]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(phase_metrics("gen", None, [], timer), f)
    dist.destroy_process_group()


def test_largest_footprint_and_spread_agreed_over_the_ranks():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(os.path.join(tmp, "init"), tmp), nprocs=len(USED_BY_RANK))
        reported = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in range(len(USED_BY_RANK))]
    # used 8, 10, 9 GiB: max 10 at rank 1, spread (10 - 8) / 10; own 6, 6, 5: (6 - 5) / 6; the rest 2, 4, 4: 2 / 4
    expected = {USED_PREFIX + "gen": 10.0, IMBALANCE_PREFIX + "gen": pytest.approx(0.2), MOST_RANK_PREFIX + "gen": 1.0,
                OWN_IMBALANCE_PREFIX + "gen": pytest.approx(1 / 6), OTHERS_IMBALANCE_PREFIX + "gen": pytest.approx(0.5),
                MEMORY_PREFIX + "gen": 4.0}
    assert reported == [expected] * len(USED_BY_RANK)


def test_no_reading_on_the_cpu_reports_nothing():
    timer = PhaseTimer(torch.device("cpu"), "actor")
    timer.note_device_used()
    assert timer.device_used_bytes is None
    assert phase_metrics("actor", None, [], timer) == {}
