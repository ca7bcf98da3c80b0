"""veRL's profiler keys → the phases, steps and ranks verlx's phase profiler records (workers/profiling.py).

global_profiler.{tool, steps, save_path} and each role's profiler section {enable, all_ranks, ranks, save_path,
tool_config} pick what is recorded: a role's phases (ROLE_PHASES) at the listed training steps, on its ranks
(all_ranks; ranks; rank 0 when enabled with none, as veRL does), with the role's tool. The selection is the same for
every tool; only the recorder differs: torch writes a torch.profiler trace per phase call (veRL's discrete=true),
nsys marks the calls for Nsight Systems (workers/nsight.py), torch_memory records torch's CUDA memory history during
each call and writes its snapshot (workers/memory_snapshots.py). veRL's npu and precision_debugger are refused.
"""

from __future__ import annotations

import shutil
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from verlx.config.loader import Findings
from verlx.config.profiler import PROFILER_TOOLS
from verlx.utils.paths import expand_path

if TYPE_CHECKING:
    import torch

# the verlx phases (their metric names) each veRL profiler section covers
ROLE_PHASES = {
    "actor_rollout_ref.actor": ("actor_infer", "actor"),
    "actor_rollout_ref.ref": ("ref",),
    "actor_rollout_ref.rollout": ("gen",),
    "critic": ("critic_infer", "critic"),
    "reward_model": ("reward_model",),
}
# tool_config.torch.contents: what veRL records and verlx maps onto torch.profiler's arguments
TORCH_CONTENTS = ("cuda", "cpu", "memory", "shapes", "stack")
# torch.cuda.memory._record_memory_history's context and stacks (veRL's global_tool_config.torch_memory)
MEMORY_CONTEXTS = ("state", "alloc", "all")
MEMORY_STACKS = ("python", "all")


@dataclass(frozen=True)
class MemoryHistory:
    """tool=torch_memory: torch.cuda.memory._record_memory_history's arguments, from the role's
    tool_config.torch_memory and global_profiler.global_tool_config.torch_memory (context, stacks, kw_args)."""

    max_entries: int
    context: str
    stacks: str
    extra: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class PhaseRequest:
    directory: str
    ranks: frozenset[int] | None  # None: every rank
    contents: frozenset[str]
    tool: str
    discrete: bool  # the role's tool_config.<tool>.discrete (torch writes one trace per call either way)
    memory: MemoryHistory | None = None  # tool=torch_memory


@dataclass(frozen=True)
class ProfiledCall:
    """One call of a phase that is to be recorded, and how."""

    phase: str
    rank: int
    step: int | None  # None: selected by the VERLX_PROFILE_* environment, not by step
    call: int  # which call of the phase (in its step, or in the run)
    name: str  # <phase>_step<N>_rank<R>[_<call>] or <phase>_call<N>_rank<R>: the torch trace's file stem
    directory: str
    contents: frozenset[str]
    discrete: bool = True
    memory: MemoryHistory | None = None


class PhaseRecorder(Protocol):
    """What records a tool's profiled calls in a worker process (workers/profiling.RECORDERS)."""

    def record(self, call: ProfiledCall, device: torch.device) -> AbstractContextManager: ...

    def step_starts(self, step: int, plan: ProfilePlan) -> None: ...

    def finish(self) -> None: ...


@dataclass(frozen=True)
class ProfilePlan:
    steps: frozenset[int]
    phases: dict[str, PhaseRequest]
    continuous: bool  # global_profiler.profile_continuous_steps

    def request(self, phase: str, step: int | None, rank: int) -> PhaseRequest | None:
        wanted = self.phases.get(phase)
        if wanted is None or step not in self.steps or (wanted.ranks is not None and rank not in wanted.ranks):
            return None
        return wanted


def role_sections(config) -> dict:
    arr = config.actor_rollout_ref
    return {"actor_rollout_ref.actor": arr.actor.profiler, "actor_rollout_ref.ref": arr.ref.profiler,
            "actor_rollout_ref.rollout": arr.rollout.profiler, "critic": config.critic.profiler,
            "reward_model": config.reward_model.profiler}


def sections_with_tool(config, tool: str) -> dict:
    """The enabled roles' profiler sections that record with `tool`, by key."""
    return {key: s for key, s in role_sections(config).items() if s.enable and s.tool == tool}


def _ranks(section) -> frozenset[int] | None:
    if section.all_ranks:
        return None
    return frozenset(section.ranks or [0])


def _memory_history(config, section) -> MemoryHistory:
    shared = config.global_profiler.global_tool_config.torch_memory
    return MemoryHistory(int(section.tool_config.torch_memory.trace_alloc_max_entries), shared.context,
                         shared.stacks, tuple(sorted(dict(shared.kw_args).items())))


def profile_plan(config) -> ProfilePlan | None:
    """What the profiler keys ask verlx to trace; None when nothing (no steps, or no enabled role with a tool)."""
    steps = config.global_profiler.steps
    if not steps:
        return None
    phases = {}
    for key, section in role_sections(config).items():
        if not section.enable or section.tool is None:
            continue
        directory = expand_path(section.save_path or config.global_profiler.save_path, absolute=True)
        tool_config = getattr(section.tool_config, section.tool, None)
        request = PhaseRequest(directory, _ranks(section), frozenset(section.tool_config.torch.contents),
                               section.tool, getattr(tool_config, "discrete", True),
                               _memory_history(config, section) if section.tool == "torch_memory" else None)
        phases.update({phase: request for phase in ROLE_PHASES[key]})
    if not phases:
        return None
    return ProfilePlan(frozenset(steps), phases, config.global_profiler.profile_continuous_steps)


def check_profiler(config, f: Findings, world_size: int) -> None:
    """Tools verlx has, steps and ranks that exist, contents torch.profiler records; warnings when the keys set
    would trace nothing (veRL then traces nothing too)."""
    g = config.global_profiler
    f.require(g.tool is None or g.tool in PROFILER_TOOLS, _tool_problem("global_profiler.tool", g.tool))
    f.require(not g.steps or all(s >= 1 for s in g.steps),
              f"global_profiler.steps={g.steps}: training steps count from 1")
    enabled = []
    for key, section in role_sections(config).items():
        if not section.enable:
            continue
        enabled.append(key)
        f.require(section.tool is None or section.tool in PROFILER_TOOLS,
                  _tool_problem(f"{key}.profiler.tool", section.tool))
        bad = [r for r in section.ranks if not 0 <= r < world_size]
        f.require(not bad, f"{key}.profiler.ranks={section.ranks}: ranks {bad} do not exist among the {world_size} "
                  "workers (trainer.nnodes × trainer.n_gpus_per_node)")
        unknown = sorted(set(section.tool_config.torch.contents) - set(TORCH_CONTENTS))
        f.require(not unknown, f"{key}.profiler.tool_config.torch.contents: {unknown} are not among "
                  f"{list(TORCH_CONTENTS)}")
    if "actor_rollout_ref.rollout" in enabled:
        f.require(config.actor_rollout_ref.hybrid_engine,
                  "actor_rollout_ref.rollout.profiler.enable=true with actor_rollout_ref.hybrid_engine=false: verlx "
                  "profiles the rollout engines colocated with the actor only; profile the trainer's roles instead")
    check_nsys(config, f)
    check_torch_memory(config, f)
    if enabled and not g.steps:
        f.warnings.append(f"the profiler of {', '.join(enabled)} is enabled but global_profiler.steps is null: "
                          "nothing is profiled (set e.g. global_profiler.steps=[1,2])")
    elif g.steps and not enabled:
        f.warnings.append("global_profiler.steps is set but no role's profiler.enable is true: nothing is profiled "
                          "(e.g. actor_rollout_ref.actor.profiler.enable=true)")


def check_nsys(config, f: Findings) -> None:
    """tool=nsys records CUDA activity of workers Ray starts under `nsys profile`: a CUDA run, nsys on PATH."""
    key = _cuda_tool_key(config, "nsys", "Nsight Systems records CUDA workers")
    if key is not None:
        f.require(config.trainer.device == "cuda", key[1])
        f.require(shutil.which("nsys") is not None, f"{key[0]}=nsys: the nsys command (Nsight Systems) is not on "
                  f"PATH; install Nsight Systems on every node and put nsys on PATH, or set {key[0]}=torch")


def check_torch_memory(config, f: Findings) -> None:
    """tool=torch_memory records the CUDA caching allocator: a CUDA run, torch's own settings in range."""
    key = _cuda_tool_key(config, "torch_memory", "torch's memory history records the CUDA caching allocator")
    if key is None:
        return
    f.require(config.trainer.device == "cuda", key[1])
    shared = config.global_profiler.global_tool_config.torch_memory
    where = "global_profiler.global_tool_config.torch_memory"
    f.require(shared.context in MEMORY_CONTEXTS, f"{where}.context={shared.context!r}: torch records "
              f"{', '.join(MEMORY_CONTEXTS)}")
    f.require(shared.stacks in MEMORY_STACKS, f"{where}.stacks={shared.stacks!r}: torch records "
              f"{' or '.join(MEMORY_STACKS)} stacks")
    for section_key, section in sections_with_tool(config, "torch_memory").items():
        entries = section.tool_config.torch_memory.trace_alloc_max_entries
        f.require(int(entries) >= 1, f"{section_key}.profiler.tool_config.torch_memory.trace_alloc_max_entries="
                  f"{entries}: the history keeps at least one allocation (veRL's default: 100000)")


def _cuda_tool_key(config, tool: str, why: str) -> tuple[str, str] | None:
    """(the key that chose `tool`, the message refusing a run off CUDA) when an enabled role records with it at
    some step, else None."""
    roles = list(sections_with_tool(config, tool))
    if not roles or not config.global_profiler.steps:
        return None
    key = "global_profiler.tool" if config.global_profiler.tool == tool else f"{roles[0]}.profiler.tool"
    return key, (f"{key}={tool} with trainer.device={config.trainer.device}: {why}; run on GPUs "
                 f"(trainer.device=cuda) or set {key}=torch")


def _tool_problem(key: str, tool) -> str:
    return (f"{key}={tool}: verlx profiles with {', '.join(PROFILER_TOOLS)} (torch.profiler traces, Nsight Systems "
            "ranges or CUDA memory snapshots of each phase: workers/profiling.py); NPU and precision_debugger "
            f"profiling are not supported. Set {key} to one of {', '.join(PROFILER_TOOLS)}")


def worker_nsight_options(config) -> dict[str, str] | None:
    """Ray's runtime_env `nsight` field for the trainer's workers when a phase is recorded with nsys, else None:
    global_profiler.global_tool_config.nsys.worker_nsight_options, null options left out, capture-range-end null
    read as repeat (one report per capture range until the worker exits: veRL's repeat-shutdown:<6 × steps> would
    stop early where more than six phase calls a step are recorded, as on a worker of actor, ref and critic)."""
    plan = profile_plan(config)
    if plan is None or all(r.tool != "nsys" for r in plan.phases.values()):
        return None
    return _nsight_options(config)


def _nsight_options(config) -> dict[str, str]:
    options = dict(config.global_profiler.global_tool_config.nsys.worker_nsight_options)
    if options.get("capture-range-end") is None:
        options["capture-range-end"] = "repeat"
    return {name: _option_text(value) for name, value in options.items() if value is not None}


def _option_text(value) -> str:
    """An nsys option's value as its command line takes it (Hydra reads `true` as a boolean)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def profiler_notes(config) -> list[str]:
    """What the profiler keys became, said once at start."""
    plan = profile_plan(config)
    if plan is None:
        return []
    notes = []
    for tool, notes_of in TOOL_NOTES.items():
        phases = {phase: r for phase, r in plan.phases.items() if r.tool == tool}
        if phases:
            notes += notes_of(config, plan, phases)
    return notes


def _selection(plan: ProfilePlan, phases: dict[str, PhaseRequest]) -> str:
    listed = ", ".join(f"{phase} (ranks {'all' if r.ranks is None else sorted(r.ranks)})"
                       for phase, r in phases.items())
    return f"{listed} at steps {sorted(plan.steps)}"


def _torch_notes(config, plan: ProfilePlan, phases: dict[str, PhaseRequest]) -> list[str]:
    directories = sorted({r.directory for r in phases.values()})
    notes = [f"profiler keys → verlx's phase profiler: {_selection(plan, phases)}, traced with torch.profiler into "
             f"{', '.join(directories)} as <phase>_step<N>_rank<R>.json with a _summary.json"]
    discrete_off = [s for s in sections_with_tool(config, "torch").values() if not s.tool_config.torch.discrete]
    if discrete_off or config.global_profiler.profile_continuous_steps:
        notes.append("profiler tool_config.torch.discrete=false / global_profiler.profile_continuous_steps (veRL: one "
                     "trace over a whole step or several): verlx writes one trace per phase and step")
    return notes


def _nsys_notes(config, plan: ProfilePlan, phases: dict[str, PhaseRequest]) -> list[str]:
    options = " ".join(f"--{name}={value}" for name, value in _nsight_options(config).items())
    per_call = sorted(phase for phase, r in phases.items() if r.discrete)
    per_step = sorted(phase for phase, r in phases.items() if not r.discrete)
    ranges = [f"one capture range per call of {', '.join(per_call)} (discrete=true)"] if per_call else []
    if per_step:
        span = "consecutive profiled steps" if plan.continuous else "each profiled step"
        ranges.append(f"one capture range over {span} for {', '.join(per_step)} (discrete=false: from the step's "
                      "first recorded phase until the driver starts the next step, or the worker closes)")
    return [f"profiler keys → Nsight Systems: {_selection(plan, phases)}; the trainer's worker processes run under "
            f"`nsys profile {options}` (Ray's runtime_env nsight), each recorded phase call an NVTX range "
            f"<phase>_step<N>, {'; '.join(ranges)}. Ray writes the reports as worker_process_<pid>[.<n>].nsys-rep "
            "into logs/nsight/ of its session directory on each worker's node (/tmp/ray/session_latest/logs/nsight "
            f"with Ray's default temp directory), not into save_path",
            "global_profiler.global_tool_config.nsys.controller_nsight_options is not used: verlx's driver is the "
            "process you launched, not a Ray actor; to profile it too, launch it under `nsys profile` with those "
            "options"]


def _torch_memory_notes(config, plan: ProfilePlan, phases: dict[str, PhaseRequest]) -> list[str]:
    directories = sorted({r.directory for r in phases.values()})
    notes = [f"profiler keys → torch's CUDA memory history: {_selection(plan, phases)}, recorded during each such "
             f"phase call and written as a snapshot into {', '.join(directories)} as <phase>_step<N>_rank<R>.pickle "
             "(also when the call fails, an out-of-memory error included; open it in https://pytorch.org/memory_viz)"]
    if any(s.tool_config.torch_memory.memory_snapshot_num_steps != 1
           for s in sections_with_tool(config, "torch_memory").values()):
        notes.append("profiler tool_config.torch_memory.memory_snapshot_num_steps (veRL: one snapshot over that many "
                     "profiled steps): verlx writes one snapshot per phase call and step")
    notes.append("profiler tool_config.torch_memory.stack_depth is not used: torch records whole stacks "
                 "(global_profiler.global_tool_config.torch_memory.stacks: python or all)")
    return notes


# what each tool's notes say (profiler_notes)
TOOL_NOTES = {"torch": _torch_notes, "nsys": _nsys_notes, "torch_memory": _torch_memory_notes}
