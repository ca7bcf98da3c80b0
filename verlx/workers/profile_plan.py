"""veRL's profiler keys → the phases, steps and ranks verlx's phase profiler traces (workers/profiling.py).

global_profiler.{tool, steps, save_path} and each role's profiler section {enable, all_ranks, ranks, save_path,
tool_config.torch.contents} pick what is traced: a role's phases (ROLE_PHASES) at the listed training steps, on its
ranks (all_ranks; ranks; rank 0 when enabled with none, as veRL does). verlx's tool is torch.profiler, one trace per
phase call (veRL's discrete=true); the other tools are refused naming it.
"""

from __future__ import annotations

from dataclasses import dataclass

from verlx.config.loader import Findings
from verlx.config.profiler import PROFILER_TOOLS
from verlx.utils.paths import expand_path

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


@dataclass(frozen=True)
class PhaseRequest:
    directory: str
    ranks: frozenset[int] | None  # None: every rank
    contents: frozenset[str]


@dataclass(frozen=True)
class ProfilePlan:
    steps: frozenset[int]
    phases: dict[str, PhaseRequest]

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


def _ranks(section) -> frozenset[int] | None:
    if section.all_ranks:
        return None
    return frozenset(section.ranks or [0])


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
        request = PhaseRequest(directory, _ranks(section), frozenset(section.tool_config.torch.contents))
        phases.update({phase: request for phase in ROLE_PHASES[key]})
    return ProfilePlan(frozenset(steps), phases) if phases else None


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
    if enabled and not g.steps:
        f.warnings.append(f"the profiler of {', '.join(enabled)} is enabled but global_profiler.steps is null: "
                          "nothing is profiled (set e.g. global_profiler.steps=[1,2])")
    elif g.steps and not enabled:
        f.warnings.append("global_profiler.steps is set but no role's profiler.enable is true: nothing is profiled "
                          "(e.g. actor_rollout_ref.actor.profiler.enable=true)")


def _tool_problem(key: str, tool) -> str:
    return (f"{key}={tool}: verlx profiles with {', '.join(PROFILER_TOOLS)} (torch.profiler traces of each phase, "
            "workers/profiling.py); Nsight Systems, NPU, torch_memory and precision_debugger profiling are not "
            f"supported. Set {key}=torch")


def profiler_notes(config) -> list[str]:
    """What the profiler keys became, said once at start."""
    plan = profile_plan(config)
    if plan is None:
        return []
    phases = ", ".join(f"{phase} (ranks {'all' if r.ranks is None else sorted(r.ranks)})"
                       for phase, r in plan.phases.items())
    directories = sorted({r.directory for r in plan.phases.values()})
    notes = [f"profiler keys → verlx's phase profiler: {phases} at steps {sorted(plan.steps)}, traced with "
             f"torch.profiler into {', '.join(directories)} as <phase>_step<N>_rank<R>.json with a _summary.json"]
    discrete_off = [key for key, s in role_sections(config).items()
                    if s.enable and s.tool is not None and not s.tool_config.torch.discrete]
    if discrete_off or config.global_profiler.profile_continuous_steps:
        notes.append("profiler tool_config.torch.discrete=false / global_profiler.profile_continuous_steps (veRL: one "
                     "trace over a whole step or several): verlx writes one trace per phase and step")
    return notes
