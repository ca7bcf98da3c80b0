"""Phase profiles on demand, for finding where a phase's time goes (docs/benchmarks.md, "update inside main_ppo").

Off unless VERLX_PROFILE_DIR is set in the workers' environment (the driver passes it on, trainer/ray_startup):

  VERLX_PROFILE_DIR=<dir>            where traces and summaries go
  VERLX_PROFILE_PHASES=actor         phases by their metric names (gen, actor_infer, ref, actor, critic_infer, critic)
  VERLX_PROFILE_CALLS=2              which call of each phase (1 = the first: compilation included)
  VERLX_PROFILE_RANKS=0              which ranks

veRL's profiler keys (global_profiler.steps, each role's profiler section) select phases by training step instead
(workers/profile_plan.py): the driver tells the workers each step's number (`set_profile_step`), and a selected
phase is recorded by its role's tool (RECORDERS): torch writes `<phase>_step<n>_rank<r>.json` (a second call in one
step, e.g. DAPO's extra generation rounds, adds `_2`, `_3`, ...); nsys marks the call for Nsight Systems
(workers/nsight.py) and runs no torch.profiler; torch_memory writes the call's CUDA memory snapshot as
`<phase>_step<n>_rank<r>.pickle` (workers/memory_snapshots.py).

A profiled call writes `<phase>_call<n>_rank<r>.json` (a Chrome trace: chrome://tracing or Perfetto) and
`<phase>_call<n>_rank<r>_summary.json`: the phase's wall time; the device's busy time (the union of its kernel
intervals) and idle time; the top kernels and host ops; the host-side synchronisations counted by the ops and runtime
calls that make the host wait for the device (an `.item()` is aten::_local_scalar_dense); the calls that take device
memory from the driver or give it back (cudaMalloc, cuMemMap, ...), with their time; the micro-batches and
optimizer steps (record_function markers of the training engine) with the synchronisations per micro-batch; and
the graphs torch.compile built during the phase (recompilations show up there).
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections import Counter
from contextlib import contextmanager, nullcontext

import torch

from verlx.single_controller import Dispatch, register
from verlx.workers.memory_snapshots import MemorySnapshots
from verlx.workers.nsight import NsightRanges
from verlx.workers.profile_plan import PhaseRecorder, ProfiledCall, ProfilePlan, profile_plan

logger = logging.getLogger(__name__)
DIR_ENV, PHASES_ENV, CALLS_ENV, RANKS_ENV = ("VERLX_PROFILE_DIR", "VERLX_PROFILE_PHASES", "VERLX_PROFILE_CALLS",
                                             "VERLX_PROFILE_RANKS")
MICRO_BATCH, OPTIMIZER_STEP = "verlx/micro_batch", "verlx/optimizer_step"
# runtime calls that block the host until the device is done (cudaMemcpyAsync is not among them: an asynchronous
# copy blocks only when its host memory is pageable, which the trace shows by its duration)
HOST_SYNCS = frozenset({"cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy"})
# ops that need a value on the host (.item(), bool(tensor), nonzero): a device sync when their tensor is on the
# GPU, plain host work on CPU tensors; counted outermost (is_nonzero calls _local_scalar_dense)
SYNC_OPS = frozenset({"aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero"})
# device memory the caching allocator takes from or gives back to the driver: synchronous and slow, and frequent when
# the cache was emptied between phases (expandable segments map pages with the cuMem calls)
ALLOCATOR_CALLS = frozenset({"cudaMalloc", "cudaFree", "cuMemCreate", "cuMemMap", "cuMemSetAccess", "cuMemUnmap",
                             "cuMemRelease", "cudaHostAlloc"})
_calls: Counter = Counter()
# the profiler keys' plan of this process and the training step running (set_profile_step)
_plan: ProfilePlan | None = None
_step: int | None = None
# this process's recorder of each tool, made at its first recorded call
_recorders: dict[str, PhaseRecorder] = {}


class StepProfiling:
    """Worker mixin: the driver names each training step before it runs when the profiler keys select steps."""

    config = None

    @register(Dispatch.ONE_TO_ALL)
    def set_profile_step(self, step: int) -> None:
        start_step(self.config, step)


def start_step(config, step: int) -> None:
    """Training step `step` starts in this process: phases selected by global_profiler.steps are recorded."""
    global _plan, _step
    if _plan is None:
        _plan = profile_plan(config)
    _step = int(step)
    if _plan is not None:
        for recorder in _recorders.values():
            recorder.step_starts(_step, _plan)


def finish_profiling() -> None:
    """The worker closes: recorders end what spans phases (an Nsight capture range over a step)."""
    for recorder in _recorders.values():
        recorder.finish()


def _wanted(phase: str, rank: int) -> tuple[str, ProfiledCall] | None:
    """(tool, the call) when this call of `phase` on `rank` is to be recorded: by the profiler keys' plan when it
    has one, else by the VERLX_PROFILE_* environment (torch)."""
    if _plan is not None:
        request = _plan.request(phase, _step, rank)
        if request is None:
            return None
        _calls[(phase, _step)] += 1
        repeat = _calls[(phase, _step)]
        name = f"{phase}_step{_step}_rank{rank}" + (f"_{repeat}" if repeat > 1 else "")
        return request.tool, ProfiledCall(phase, rank, _step, repeat, name, request.directory, request.contents,
                                          request.discrete, request.memory)
    directory = os.environ.get(DIR_ENV)
    if not directory:
        return None
    _calls[phase] += 1
    phases = os.environ.get(PHASES_ENV, "actor").split(",")
    calls = [int(c) for c in os.environ.get(CALLS_ENV, "2").split(",")]
    ranks = [int(r) for r in os.environ.get(RANKS_ENV, "0").split(",")]
    if phase in phases and _calls[phase] in calls and rank in ranks:
        call = _calls[phase]
        return "torch", ProfiledCall(phase, rank, None, call, f"{phase}_call{call}_rank{rank}", directory, frozenset())
    return None


def phase_profile(phase: str, rank: int, device: torch.device):
    """A context that records this call of `phase` when the profiler keys or the environment ask for it (else does
    nothing)."""
    wanted = _wanted(phase, rank)
    if wanted is None:
        return nullcontext()
    tool, call = wanted
    if tool not in _recorders:
        _recorders[tool] = RECORDERS[tool]()
    return _recorders[tool].record(call, device)


def profiler_arguments(device: torch.device, contents: frozenset[str]) -> dict:
    """torch.profiler.profile's arguments for veRL's tool_config.torch.contents: host activity always, device kernels
    on a GPU unless contents names others only, memory / shapes / stack as named."""
    from torch.profiler import ProfilerActivity

    device_kernels = device.type == "cuda" and (not contents or "cuda" in contents)
    return {"activities": [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_kernels else []),
            "profile_memory": "memory" in contents, "record_shapes": "shapes" in contents,
            "with_stack": "stack" in contents}


class TorchTrace:
    """tool=torch: a torch.profiler trace of each recorded call, with its summary; nothing spans calls."""

    @contextmanager
    def record(self, call: ProfiledCall, device: torch.device):
        from torch._dynamo.utils import counters
        from torch.profiler import profile

        graphs_before = counters["stats"]["unique_graphs"]
        start = time.perf_counter()
        with profile(**profiler_arguments(device, call.contents)) as prof:
            yield
            if device.type == "cuda":
                torch.cuda.synchronize(device)
        wall = time.perf_counter() - start
        os.makedirs(call.directory, exist_ok=True)
        stem = os.path.join(call.directory, call.name)
        prof.export_chrome_trace(f"{stem}.json")
        summary = summarize(prof.events(), wall)
        summary.update(phase=call.phase, call=call.call, rank=call.rank, step=call.step, trace=call.name,
                       compiled_graphs=counters["stats"]["unique_graphs"] - graphs_before)
        with open(f"{stem}_summary.json", "w") as f:
            json.dump(summary, f, indent=1)
        logger.info("profiled %s (%s): %.3f s wall, device busy %.3f s, %d host syncs; %s_summary.json",
                    call.phase, call.name, wall, summary["device_busy_s"], sum(summary["host_syncs"].values()), stem)

    def step_starts(self, step: int, plan: ProfilePlan) -> None:
        """Each trace ends with its call: nothing to end when a step starts."""

    def finish(self) -> None:
        """Each trace ends with its call: nothing to end when the worker closes."""


# the recorder of each profiler tool (global_profiler.tool, <role>.profiler.tool; config/profiler.PROFILER_TOOLS)
RECORDERS: dict[str, type[PhaseRecorder]] = {"torch": TorchTrace, "nsys": NsightRanges,
                                             "torch_memory": MemorySnapshots}


def _has_ancestor(event, names: frozenset) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in names:
            return True
        parent = parent.cpu_parent
    return False


def _union_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of (start, end) intervals in microseconds, in seconds."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total / 1e6


def summarize(events, wall_s: float, top: int = 15) -> dict:
    """Busy and idle device time, top kernels and host ops, host synchronisations (also per micro-batch)."""
    from torch.autograd import DeviceType

    kernels = [e for e in events if e.device_type == DeviceType.CUDA]
    host = [e for e in events if e.device_type == DeviceType.CPU]
    busy = _union_seconds([(e.time_range.start, e.time_range.end) for e in kernels])
    syncs = [e for e in host if e.name in HOST_SYNCS]
    sync_ops = [e for e in host if e.name in SYNC_OPS and not _has_ancestor(e, SYNC_OPS)]
    allocator = [e for e in host if e.name in ALLOCATOR_CALLS]
    micro = [e for e in host if e.name == MICRO_BATCH]

    def per_micro_batch(items) -> float | None:
        inside = [s for s in items if any(m.time_range.start <= s.time_range.start <= m.time_range.end for m in micro)]
        return len(inside) / len(micro) if micro else None

    def totals(items) -> list[tuple[str, float]]:
        acc: Counter = Counter()
        for e in items:
            acc[e.name] += (e.time_range.end - e.time_range.start) / 1e6
        return [(name, round(s, 6)) for name, s in acc.most_common(top)]

    return {
        "wall_s": wall_s, "device_busy_s": busy, "device_idle_s": max(wall_s - busy, 0.0),
        "device_busy_fraction": busy / wall_s if wall_s > 0 else 0.0, "kernels": len(kernels),
        "top_kernels_s": totals(kernels),
        "top_host_ops_s": totals([e for e in host if e.name.startswith("aten::")]),
        "host_syncs": dict(Counter(e.name for e in syncs)), "sync_ops": dict(Counter(e.name for e in sync_ops)),
        "allocator_calls": dict(Counter(e.name for e in allocator)), "allocator_s": dict(totals(allocator)),
        "micro_batches": len(micro), "optimizer_steps": sum(e.name == OPTIMIZER_STEP for e in host),
        "host_syncs_per_micro_batch": per_micro_batch(syncs), "sync_ops_per_micro_batch": per_micro_batch(sync_ops),
    }
