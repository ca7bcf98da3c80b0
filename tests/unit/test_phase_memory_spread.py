"""Resident device memory of a phase across ranks (the TP memory-imbalance check): phase_metrics reports the
largest rank's footprint and (max - min) / max over a real 2-rank gloo group; on the CPU (no reading) neither."""

from __future__ import annotations

import json
import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verlx.metrics.phases import IMBALANCE_PREFIX, USED_PREFIX, phase_metrics
from verlx.workers.perf import PhaseTimer

GIB = 2**30
USED_BY_RANK = (10 * GIB, 8 * GIB)  # rank 0 holds 10 GiB, rank 1 holds 8 GiB


def _rank(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=len(USED_BY_RANK))
    timer = PhaseTimer(torch.device("cpu"), "gen", rank)
    timer.device_used_bytes = USED_BY_RANK[rank]
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(phase_metrics("gen", None, [], timer), f)
    dist.destroy_process_group()


def test_largest_footprint_and_spread_agreed_over_the_ranks():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_rank, args=(os.path.join(tmp, "init"), tmp), nprocs=len(USED_BY_RANK))
        reported = []
        for r in range(len(USED_BY_RANK)):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                reported.append(json.load(f))
    expected = {USED_PREFIX + "gen": 10.0, IMBALANCE_PREFIX + "gen": pytest.approx(0.2)}
    assert reported == [expected, expected]


def test_no_reading_on_the_cpu_reports_nothing():
    timer = PhaseTimer(torch.device("cpu"), "actor")
    timer.note_device_used()
    assert timer.device_used_bytes is None
    assert phase_metrics("actor", None, [], timer) == {}
