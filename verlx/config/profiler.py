"""Typed config of veRL's profiler keys (global_profiler, and the profiler section of every role): mapped onto
verlx's phase profiler (workers/profiling.py), which traces phases with torch.profiler."""

from __future__ import annotations

from dataclasses import dataclass, field

# global_profiler.tool / <role>.profiler.tool: what verlx runs; veRL's others are refused naming these
PROFILER_TOOLS = ("torch",)


@dataclass
class NsysToolConfig:
    discrete: bool = False


@dataclass
class GlobalToolConfig:
    nsys: NsysToolConfig = field(default_factory=NsysToolConfig)


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


@dataclass
class ProfilerConfig:
    tool: str | None = None
    enable: bool = False
    all_ranks: bool = False
    ranks: list[int] = field(default_factory=list)
    save_path: str | None = None
    tool_config: RoleToolConfig = field(default_factory=RoleToolConfig)
