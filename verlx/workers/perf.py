"""The timer of a worker's phase: seconds of compute and peak device memory (verlx/metrics/phases.py turns them into
metrics), with the phase profiled when the environment asks for it."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext

import torch

from verlx.utils.memory import unbacked_allocated_bytes
from verlx.workers.profiling import phase_profile


class PhaseTimer:
    """Seconds of compute and the device's peak allocation of one phase (`with meter.measure(): ...`); a named
    phase is profiled when the environment asks for it (workers/profiling.py), outside the seconds measured."""

    def __init__(self, device: torch.device, phase: str | None = None, rank: int = 0, unbacked_bytes: int = 0):
        """`unbacked_bytes`: allocated to torch but holding no device memory during the phase (a sleeping
        engine's unmapped pool, RolloutEngine.unbacked_allocated_bytes), left out of the peak."""
        self.device, self.phase, self.rank = device, phase, rank
        self.unbacked_bytes = unbacked_bytes
        self.seconds = 0.0
        self.peak_bytes: int | None = None
        self.device_used_bytes: int | None = None
        self.own_reserved_bytes: int | None = None

    def note_device_used(self) -> None:
        """Record what every process holds on this GPU now (the rollout engine may run its own processes) and how
        much of it this process's allocator reserves: the phase's resident footprint, compared across ranks by
        phase_metrics (the split says whether a rank holds more because of the trainer or of the rest); no-op on
        CPU."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            free, total = torch.cuda.mem_get_info(self.device)
            self.device_used_bytes = total - free
            self.own_reserved_bytes = torch.cuda.memory_reserved(self.device)

    @contextmanager
    def measure(self):
        on_cuda = self.device.type == "cuda"
        with phase_profile(self.phase, self.rank, self.device) if self.phase else nullcontext():
            if on_cuda:
                torch.cuda.synchronize(self.device)
                torch.cuda.reset_peak_memory_stats(self.device)
            start = time.perf_counter()
            try:
                yield self
            finally:
                if on_cuda:
                    torch.cuda.synchronize(self.device)
                    self.peak_bytes = torch.cuda.max_memory_allocated(self.device) - self.unbacked_bytes
                self.seconds = time.perf_counter() - start


def training_phase_timer(device: torch.device, phase: str, rank: int = 0) -> PhaseTimer:
    """The timer of a phase that runs while this process's rollout engine sleeps (every phase but generation, for
    every role of a colocated process): its peak leaves out what the sleeping engine keeps allocated to torch
    without device memory (in-process vLLM's unmapped pool, which read 100 GB on an 80 GB card)."""
    return PhaseTimer(device, phase, rank, unbacked_allocated_bytes())
