"""Typed config of veRL's profiler keys (global_profiler, and the profiler section of every role): mapped onto
verlx's phase profiler (workers/profiling.py), which records phases with torch.profiler, Nsight Systems or torch's
CUDA memory history (torch_memory)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# global_profiler.tool / <role>.profiler.tool: what verlx runs; veRL's others are refused naming these
PROFILER_TOOLS = ("torch", "nsys", "torch_memory")
# `nsys profile` options as Ray's runtime_env `nsight` field takes them: option name (without dashes) → value
NsightOptions = dict[str, str | int | float | bool | None]


def _controller_nsight_options() -> NsightOptions:
    return {"trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph"}


def _worker_nsight_options() -> NsightOptions:
    return {**_controller_nsight_options(), "capture-range": "cudaProfilerApi", "capture-range-end": None,
            "kill": "none"}


@dataclass
class NsysToolConfig:
    discrete: bool = False


@dataclass
class GlobalNsysConfig:
    discrete: bool = False
    controller_nsight_options: NsightOptions = field(default_factory=_controller_nsight_options)
    worker_nsight_options: NsightOptions = field(default_factory=_worker_nsight_options)


@dataclass
class TorchMemoryToolConfig:
    trace_alloc_max_entries: int = 100_000
    stack_depth: int = 32
    memory_snapshot_num_steps: int = 1


@dataclass
class GlobalTorchMemoryConfig(TorchMemoryToolConfig):
    context: str = "all"
    stacks: str = "all"
    kw_args: dict[str, Any] = field(default_factory=dict)


@dataclass
class GlobalToolConfig:
    nsys: GlobalNsysConfig = field(default_factory=GlobalNsysConfig)
    torch_memory: GlobalTorchMemoryConfig = field(default_factory=GlobalTorchMemoryConfig)


@dataclass
class GlobalProfilerConfig:
    tool: str | None = None
    steps: list[int] | None = None
    profile_continuous_steps: bool = False
    save_path: str = "outputs/profile"
    global_tool_config: GlobalToolConfig = field(default_factory=GlobalToolConfig)


@dataclass
class TorchToolConfig:
    discrete: bool = False
    contents: list[str] = field(default_factory=list)


@dataclass
class RoleToolConfig:
    torch: TorchToolConfig = field(default_factory=TorchToolConfig)
    nsys: NsysToolConfig = field(default_factory=NsysToolConfig)
    torch_memory: TorchMemoryToolConfig = field(default_factory=TorchMemoryToolConfig)


@dataclass
class ProfilerConfig:
    tool: str | None = None
    enable: bool = False
    all_ranks: bool = False
    ranks: list[int] = field(default_factory=list)
    save_path: str | None = None
    tool_config: RoleToolConfig = field(default_factory=RoleToolConfig)
