"""Nsight Systems in a worker process (veRL's tool=nsys): the profiled phase calls marked for `nsys profile`.

Ray starts the trainer's workers under `nsys profile <worker_nsight_options>` (workers/profile_plan.
worker_nsight_options); with veRL's capture-range=cudaProfilerApi nsys records only between
torch.cuda.profiler.start() and stop(), which this recorder calls:

- discrete=true: each recorded phase call is a capture range of its own (a report each);
- discrete=false: one capture range per profiled step on this worker, opened by the step's first recorded phase call
  and closed when the driver names the next step (set_profile_step) or the worker closes, so it also holds what the
  worker does after the step's phases (validation, saving) but not the steps that are not profiled. With
  global_profiler.profile_continuous_steps the range stays open into the next step when that step is profiled too.

Each recorded call is also an NVTX range named <phase>_step<N>. A discrete call while a step's range is open (another
role of this process with discrete=false) stays inside that range rather than ending it.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from verlx.workers.profile_plan import ProfiledCall, ProfilePlan


class NsightRanges:
    """tool=nsys: NVTX ranges around the recorded phase calls, inside Nsight capture ranges (the module docstring)."""

    def __init__(self):
        self.open_step: int | None = None  # the step whose capture range is open (discrete=false)

    @contextmanager
    def record(self, call: ProfiledCall, device: torch.device):
        own_range = call.discrete and self.open_step is None
        if own_range:
            torch.cuda.profiler.start()
        elif not call.discrete and self.open_step is None:
            torch.cuda.profiler.start()
            self.open_step = call.step
        torch.cuda.nvtx.range_push(f"{call.phase}_step{call.step}")
        try:
            yield
        finally:
            torch.cuda.nvtx.range_pop()
            if own_range:
                torch.cuda.profiler.stop()

    def step_starts(self, step: int, plan: ProfilePlan) -> None:
        """The driver names step `step`: the open step's capture range ends, unless profile_continuous_steps joins
        it to this profiled step that follows it."""
        joined = plan.continuous and step - 1 in plan.steps and step in plan.steps
        if not joined:
            self.finish()

    def finish(self) -> None:
        """End the open capture range (the next step starts, or the worker closes)."""
        if self.open_step is not None:
            torch.cuda.profiler.stop()
            self.open_step = None
