"""Before Ray starts: the rollout mode, the rollout worker group's placement, staleness and rollout correction.

Placements *overlap* when the trainer's and the rollout group's processes would need the same device: on one
machine (a local Ray), trainer.n_gpus_per_node + rollout.n_gpus_per_node must not exceed its GPUs (CPU workers:
ray_kwargs.ray_init.num_cpus when it is set); a cluster (ray_init.address or RAY_ADDRESS) is checked by Ray's placement
instead.
"""

from __future__ import annotations

from verlx.algorithms.rollout_correction import rollout_correction_problems

MODES = ("sync", "one_step_off", "async")
STALENESS_POLICIES = ("wait", "drop")


def rollout_mode_problems(cfg) -> list[str]:
    """Every problem of the keys docs/async.md describes, each naming its keys."""
    problems = rollout_correction_problems(cfg)
    t = cfg.trainer
    if t.rollout_mode not in MODES:
        return [*problems, f"trainer.rollout_mode={t.rollout_mode!r} is not one of {list(MODES)} (off-policy training, "
                           "docs/async.md; veRL's agent-loop rollout is actor_rollout_ref.rollout.mode=async)"]
    if t.staleness_policy not in STALENESS_POLICIES:
        problems.append(f"trainer.staleness_policy={t.staleness_policy!r} is not one of {list(STALENESS_POLICIES)}")
    problems += _placement_problems(cfg)
    problems += _staleness_problems(cfg)
    if t.rollout_stall_timeout_s is not None and not t.rollout_stall_timeout_s > 0:
        problems.append(f"trainer.rollout_stall_timeout_s={t.rollout_stall_timeout_s} must be positive (null = no "
                        "limit)")
    if t.on_policy_tolerance is not None and not t.on_policy_tolerance >= 0:
        problems.append(f"trainer.on_policy_tolerance={t.on_policy_tolerance} must be >= 0 (null = 0 on CPU, not "
                        "enforced on GPU)")
    return problems


def _placement_problems(cfg) -> list[str]:
    t, r = cfg.trainer, cfg.rollout
    if cfg.actor_rollout_ref.hybrid_engine:
        problems = []
        if t.rollout_mode != "sync":
            problems.append(
                f"trainer.rollout_mode={t.rollout_mode} generates while the trainer trains, so the rollout engines "
                "need processes of their own: set actor_rollout_ref.hybrid_engine=false and rollout.n_gpus_per_node "
                "(and rollout.nnodes)")
        if r.n_gpus_per_node != 0:
            problems.append(f"rollout.n_gpus_per_node={r.n_gpus_per_node} is only used with "
                            "actor_rollout_ref.hybrid_engine=false (a rollout worker group of its own); set it to 0 "
                            "or set hybrid_engine=false")
        return problems
    if r.nnodes < 1 or r.n_gpus_per_node < 1:
        return [f"actor_rollout_ref.hybrid_engine=false needs a rollout worker group with at least one GPU: "
                f"rollout.nnodes={r.nnodes} × rollout.n_gpus_per_node={r.n_gpus_per_node} gives none"]
    from verlx.trainer.ray_startup import cluster_address

    if cluster_address(cfg):
        return []
    return _overlap_problems(cfg)


def _overlap_problems(cfg) -> list[str]:
    """On one machine the trainer's and the rollout group's processes must fit side by side."""
    t, r = cfg.trainer, cfg.rollout
    if t.nnodes > 1 or r.nnodes > 1:
        return [f"trainer.nnodes={t.nnodes}, rollout.nnodes={r.nnodes}: a private Ray instance (neither "
                "ray_kwargs.ray_init.address nor RAY_ADDRESS set) has one node; join a cluster with "
                "ray_kwargs.ray_init.address=auto"]
    wanted = t.n_gpus_per_node + r.n_gpus_per_node
    if t.device == "cuda":
        import torch

        have, unit = torch.cuda.device_count(), "GPUs"
    else:
        have, unit = cfg.ray_kwargs.ray_init.num_cpus, "CPUs (ray_kwargs.ray_init.num_cpus)"
    if have is None or wanted <= have:
        return []
    return [f"the trainer (trainer.n_gpus_per_node={t.n_gpus_per_node}) and the rollout group "
            f"(rollout.n_gpus_per_node={r.n_gpus_per_node}) need {wanted} {unit} side by side but this machine has "
            f"{have}: their placements would overlap; lower one of them"]


def _staleness_problems(cfg) -> list[str]:
    t, arr = cfg.trainer, cfg.actor_rollout_ref
    mode, bound = t.rollout_mode, t.max_staleness
    problems = []
    if mode == "sync" and bound is not None:
        problems.append(f"trainer.max_staleness={bound} with trainer.rollout_mode=sync: sync mode trains every batch "
                        "with the weights that generated it; use rollout_mode=async for a staleness bound")
    if mode == "one_step_off" and bound not in (None, 1):
        problems.append(f"trainer.max_staleness={bound} with trainer.rollout_mode=one_step_off, whose staleness is 1 "
                        "by definition; remove max_staleness or use rollout_mode=async")
    if mode == "async" and (bound is None or bound < 0):
        problems.append(f"trainer.rollout_mode=async needs trainer.max_staleness >= 0 (got {bound}): the most policy "
                        "versions a sample may lag the weights it trains (0 = as sync, 1 = as one_step_off)")
    if mode != "async" and t.staleness_policy != "wait":
        problems.append(f"trainer.staleness_policy={t.staleness_policy} applies to trainer.rollout_mode=async only")
    if t.partial_rollout:
        problems += _partial_rollout_problems(cfg)
    if mode != "sync":
        a = cfg.algorithm
        from verlx.algorithms.advantages import estimator_needs_greedy_baseline

        if _needs_greedy(a.adv_estimator, estimator_needs_greedy_baseline):
            problems.append(f"algorithm.adv_estimator={a.adv_estimator} generates a greedy baseline inside the step, "
                            f"which trainer.rollout_mode={mode} does not do; use rollout_mode=sync")
        if a.filter_groups.enable:
            problems.append(f"algorithm.filter_groups.enable=true (DAPO dynamic sampling) is not supported with "
                            f"trainer.rollout_mode={mode}; use rollout_mode=sync")
        if not arr.rollout.calculate_log_probs:
            problems.append(f"trainer.rollout_mode={mode} needs the engine's log-probs (staleness and rollout "
                            "correction): set actor_rollout_ref.rollout.calculate_log_probs=true")
    return problems


def _needs_greedy(estimator: str, needs_greedy) -> bool:
    try:
        return needs_greedy(estimator)
    except KeyError:
        return False  # reported by the name checks


def _partial_rollout_problems(cfg) -> list[str]:
    t, rollout = cfg.trainer, cfg.actor_rollout_ref.rollout
    problems = []
    if t.rollout_mode != "async" or not t.max_staleness:
        problems.append("trainer.partial_rollout=true needs trainer.rollout_mode=async with max_staleness >= 1 "
                        f"(got rollout_mode={t.rollout_mode}, max_staleness={t.max_staleness}): only then is a "
                        "generation in flight when the weights change")
    if rollout.uses_agent_loop:
        key = "mode=async" if rollout.mode == "async" else "multi_turn.enable=true"
        problems.append(f"trainer.partial_rollout=true with actor_rollout_ref.rollout.{key} (the agent-loop rollout) "
                        "is not supported: an agent loop's turns are not interrupted")
    return problems
