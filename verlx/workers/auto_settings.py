"""The config side of workers/memory_plan: which keys a run leaves open, the models each GPU holds, and the worker's
copy of the config with the decisions filled in (and the lines that log them).

Keys: actor_rollout_ref.actor.{use_dynamic_bsz, ppo_max_token_len_per_gpu}, rollout/ref
log_prob_{use_dynamic_bsz, max_token_len_per_gpu}, model.enable_gradient_checkpointing; critic.{use_dynamic_bsz,
ppo_max_token_len_per_gpu, forward_max_token_len_per_gpu}, critic.model.enable_gradient_checkpointing.
"""

from __future__ import annotations

import copy
import json
import os
from types import SimpleNamespace

import torch
import torch.distributed as dist

from verlx.utils.batch_sizes import dynamic_batches, per_gpu_micro_batch_size, sequence_split_size
from verlx.utils.memory_estimate import ModelShape, ModelState, dtype_bytes
from verlx.utils.paths import expand_path
from verlx.workers.memory_plan import (
    CPU_TOKEN_BUDGET,
    EFFICIENT_MICRO_BATCH_TOKENS,
    Decision,
    GpuMemory,
    MemoryPlanError,
    RoleChoices,
    Tenant,
    Workload,
    check_fits_at_all,
    decide,
    gpu_memory,
    micro_batch_note,
    resident_bytes,
)

ACTOR = "actor_rollout_ref.actor"
ROLLOUT_BUDGET = "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"
REF_BUDGET = "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"
FSDP_STRATEGIES = ("fsdp", "fsdp2")
SHAPE_FIELDS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size")
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


def _uses_critic(cfg) -> bool:
    from verlx.algorithms.advantages import uses_critic

    try:
        return uses_critic(cfg)
    except KeyError:  # an unknown estimator, which the config checks report
        return False


def _micro(per_gpu: int | None, global_size: int | None, dp: int = 1) -> int | None:
    return per_gpu_micro_batch_size(per_gpu, global_size, dp)


def longest_sequence(cfg) -> int:
    return cfg.data.max_prompt_length + cfg.data.max_response_length


def dynamic_phases(cfg) -> list[tuple[str, int | None, bool]]:
    """(budget key, budget, whether the phase builds token-budget micro-batches) of every micro-batched phase."""
    arr, critic = cfg.actor_rollout_ref, cfg.critic
    a, r, ref = arr.actor, arr.rollout, arr.ref
    phases = [(f"{ACTOR}.ppo_max_token_len_per_gpu", a.ppo_max_token_len_per_gpu,
               dynamic_batches(a.use_dynamic_bsz, _micro(a.ppo_micro_batch_size_per_gpu, a.ppo_micro_batch_size))),
              (ROLLOUT_BUDGET, r.log_prob_max_token_len_per_gpu,
               dynamic_batches(r.log_prob_use_dynamic_bsz,
                               _micro(r.log_prob_micro_batch_size_per_gpu, r.log_prob_micro_batch_size)))]
    if cfg.uses_ref_log_prob_settings:
        phases.append((REF_BUDGET, ref.log_prob_max_token_len_per_gpu,
                       dynamic_batches(ref.log_prob_use_dynamic_bsz,
                                       _micro(ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_micro_batch_size))))
    if _uses_critic(cfg):
        dynamic = dynamic_batches(critic.use_dynamic_bsz,
                                  _micro(critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size))
        phases += [("critic.ppo_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu, dynamic),
                   ("critic.forward_max_token_len_per_gpu", critic.forward_max_token_len_per_gpu, dynamic)]
    return phases


def _target_tokens(dynamic: bool, budget: int | None, micro: int | None, mini_samples: int, longest: int,
                   sp: int) -> int:
    """Tokens per GPU of the micro-batch the checkpointing decision must fit (each of the `sp` GPUs of a Ulysses
    group holds 1/sp of it): the user's per-GPU budget, a fixed micro-batch of longest sequences, or
    EFFICIENT_MICRO_BATCH_TOKENS (no more than a whole mini-batch, no less than one sequence)."""
    if not dynamic:
        return -(-(micro or 1) * longest // sp)
    if budget is not None:
        return budget
    return max(-(-longest // sp), min(EFFICIENT_MICRO_BATCH_TOKENS, -(-mini_samples * longest // sp)))


# ---------------------------------------------------------------------------------------------- model sizes
def read_hf_shape(path: str) -> SimpleNamespace | None:
    """`path`/config.json's fields (a multimodal model's text_config merged in), read without transformers for the
    driver's check; None when the file cannot be read."""
    config_file = os.path.join(expand_path(path), "config.json")
    try:
        with open(config_file) as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return None
    return SimpleNamespace(**{**raw, **raw.get("text_config", {})})


def unestimated(hf_config) -> str | None:
    """Why the estimate cannot describe this model (it knows dense decoders of the Qwen2 / Llama family)."""
    missing = [f for f in SHAPE_FIELDS if not isinstance(getattr(hf_config, f, None), int)]
    if missing:
        return f"its config has no {', '.join(missing)}"
    if any(getattr(hf_config, f, None) for f in EXPERT_FIELDS):
        return "a mixture-of-experts model"
    return None


def model_shape(hf_config, model_path: str | None) -> ModelShape:
    """The shape of `hf_config`, with the exact parameter count of the checkpoint's safetensors headers when known."""
    from verlx.rollout.weight_sync import checkpoint_numel

    numel = checkpoint_numel(expand_path(model_path)) if model_path else None
    return ModelShape.from_hf_config(hf_config, numel)


def parameter_counts(cfg, name: str, shape: ModelShape) -> dict[str, int]:
    """Parameters of the actor and critic models: `shape` is the model of `name`; the other one's checkpoint
    headers are read when its path differs (its own count when they cannot be read)."""
    from verlx.rollout.weight_sync import checkpoint_numel

    actor_path, critic_path = cfg.actor_rollout_ref.model.path, cfg.critic.model.path
    counts = {name: shape.parameters}
    other, path = ("critic", critic_path) if name == "actor" else ("actor", actor_path)
    other_numel = checkpoint_numel(expand_path(path)) if path and critic_path not in (None, actor_path) else None
    counts[other] = other_numel or shape.parameters
    teacher = cfg.distillation.teacher.model_path if cfg.distillation.enabled else None
    if teacher is not None:  # on-policy distillation's teacher, frozen beside the actor like the reference
        counts["teacher"] = checkpoint_numel(expand_path(teacher)) or shape.parameters
    return counts


def gpu_tenants(cfg, params: dict[str, int], shards: int) -> dict[str, Tenant]:
    """Every model of the run on one GPU (all roles are colocated), with its offload settings."""
    arr = cfg.actor_rollout_ref
    lora = arr.model.lora_rank > 0  # a frozen base (gradients and Adam for the small adapters only)
    fsdp = arr.actor.fsdp_config
    out = {"actor": Tenant(ModelState("actor", params["actor"], dtype_bytes(fsdp.model_dtype), not lora, shards),
                           fsdp.param_offload, fsdp.optimizer_offload, fsdp.offload_policy)}
    if cfg.use_reference and not lora:  # a LoRA reference is the actor itself with its adapters off
        ref = arr.ref.fsdp_config
        out["ref"] = Tenant(ModelState("ref", params["actor"], dtype_bytes(ref.model_dtype), False, shards),
                            ref.param_offload)
    if "teacher" in params:  # built with the reference's settings (workers/actor_rollout_ref_worker.py)
        ref = arr.ref.fsdp_config
        out["teacher"] = Tenant(ModelState("teacher", params["teacher"], dtype_bytes(ref.model_dtype), False, shards),
                                ref.param_offload)
    if _uses_critic(cfg):
        c = cfg.critic.model.fsdp_config
        out["critic"] = Tenant(ModelState("critic", params["critic"], dtype_bytes(c.model_dtype), True, shards),
                               c.param_offload, c.optimizer_offload, c.offload_policy)
    return out


# ---------------------------------------------------------------------------------------------- per role
def actor_choices(cfg, dp: int) -> RoleChoices:
    arr = cfg.actor_rollout_ref
    a = arr.actor
    micro = _micro(a.ppo_micro_batch_size_per_gpu, a.ppo_micro_batch_size, dp)
    dynamic = dynamic_batches(a.use_dynamic_bsz, micro)
    open_forward = [key for key, budget, dyn in dynamic_phases(cfg)
                    if key in (ROLLOUT_BUDGET, REF_BUDGET) and dyn and budget is None]
    return RoleChoices(
        key=ACTOR, checkpointing=arr.model.enable_gradient_checkpointing,
        update_budget_key=f"{ACTOR}.ppo_max_token_len_per_gpu" if dynamic and a.ppo_max_token_len_per_gpu is None
        else None,
        forward_budget_keys=open_forward,
        target_tokens=_target_tokens(dynamic, a.ppo_max_token_len_per_gpu, micro,
                                     a.ppo_mini_batch_size * arr.rollout.n // dp, longest_sequence(cfg),
                                     sequence_split_size(a)))


def critic_choices(cfg, dp: int) -> RoleChoices:
    c = cfg.critic
    micro = _micro(c.ppo_micro_batch_size_per_gpu, c.ppo_micro_batch_size, dp)
    dynamic = dynamic_batches(c.use_dynamic_bsz, micro)
    forward = ["critic.forward_max_token_len_per_gpu"] if dynamic and c.forward_max_token_len_per_gpu is None else []
    return RoleChoices(
        key="critic", checkpointing=c.model.enable_gradient_checkpointing,
        update_budget_key="critic.ppo_max_token_len_per_gpu" if dynamic and c.ppo_max_token_len_per_gpu is None
        else None,
        forward_budget_keys=forward,
        target_tokens=_target_tokens(dynamic, c.ppo_max_token_len_per_gpu, micro,
                                     c.ppo_mini_batch_size * cfg.actor_rollout_ref.rollout.n // dp,
                                     longest_sequence(cfg), sequence_split_size(c)))


def plan_role(cfg, name: str, shape: ModelShape, memory: GpuMemory, world_size: int,
              choices: RoleChoices) -> Decision:
    """The estimate's decision for `name` (actor or critic, of `shape`) on a GPU of `memory`, every model of the
    run sharing it; raises MemoryPlanError."""
    role = cfg.actor_rollout_ref.actor if name == "actor" else cfg.critic
    tenants = gpu_tenants(cfg, parameter_counts(cfg, name, shape), world_size)
    work = Workload(name, shape, role.use_torch_compile, role.logprob_chunk_size if name == "actor" else 0,
                    sequence_split_size(role), longest_sequence(cfg))
    check_fits_at_all(work, tenants[name], memory, choices.key)
    forward_models = [m for m in ((name, "ref", "teacher") if name == "actor" else (name,)) if m in tenants]
    static_forward = max(resident_bytes(tenants, m, updating=False) for m in forward_models)
    return decide(work, choices, memory, resident_bytes(tenants, name, updating=True), static_forward)


def constant_decision(choices: RoleChoices, longest: int, sp: int, checkpointing: bool, why: str) -> Decision:
    """Without a memory estimate (CPU, megatron): CPU_TOKEN_BUDGET per GPU, or more when a micro-batch of the `sp`
    GPUs that split it (budget × sp tokens) would not hold the longest sequence."""
    budget = max(CPU_TOKEN_BUDGET, -(-longest // sp))
    decision = Decision(checkpointing if choices.checkpointing is None else choices.checkpointing)
    keys = [k for k in (choices.update_budget_key, *choices.forward_budget_keys) if k]
    if keys:
        decision.update_budget = budget if choices.update_budget_key else None
        decision.forward_budget = budget if choices.forward_budget_keys else None
        decision.notes.append(f"{', '.join(keys)} auto → {budget}{micro_batch_note(budget, sp)} ({why}: a fixed "
                              "budget, no memory estimate)")
    if choices.checkpointing is None:
        decision.notes.append(f"gradient checkpointing auto → {'on' if checkpointing else 'off'} ({why})")
    return decision


def agreed_memory(memory: GpuMemory) -> GpuMemory:
    """The tightest GPU of the group, so that every rank takes the same decisions."""
    if not dist.is_initialized():
        return memory
    t = torch.tensor([memory.held_by_others, memory.asleep_engine, -memory.total], dtype=torch.long)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return GpuMemory(-int(t[2]), int(t[0]), int(t[1]))


def decide_on_device(cfg, name: str, hf_config, model_path: str, device: torch.device, world_size: int,
                     choices: RoleChoices, asleep_engine: int = 0) -> Decision:
    role = cfg.actor_rollout_ref.actor if name == "actor" else cfg.critic
    memory = gpu_memory(device, asleep_engine)
    longest, sp = longest_sequence(cfg), sequence_split_size(role)
    if memory is None:
        return constant_decision(choices, longest, sp, False, "CPU run")
    if role.strategy not in FSDP_STRATEGIES:
        return constant_decision(choices, longest, sp, True, f"strategy {role.strategy}")
    if (why := unestimated(hf_config)) is not None:
        return constant_decision(choices, longest, sp, True, f"no memory estimate for {why}")
    shape = model_shape(hf_config, model_path)
    return plan_role(cfg, name, shape, agreed_memory(memory), world_size, choices)


# ---------------------------------------------------------------------------------------------- applying
def resolve_actor_settings(cfg, hf_config, model_path: str, device: torch.device, world_size: int,
                           asleep_engine: int = 0) -> tuple[object, list[str]]:
    """A copy of `cfg` with the actor's, rollout's and reference's open keys decided, and the log lines."""
    cfg = copy.deepcopy(cfg)
    arr = cfg.actor_rollout_ref
    dp = world_size // arr.actor.ulysses_sequence_parallel_size
    choices = actor_choices(cfg, dp)
    decision = decide_on_device(cfg, "actor", hf_config, model_path, device, world_size, choices, asleep_engine)
    notes = _fill_flags(cfg)
    if choices.checkpointing is None:
        arr.model.enable_gradient_checkpointing = decision.checkpointing
    if choices.update_budget_key:
        arr.actor.ppo_max_token_len_per_gpu = decision.update_budget
    if ROLLOUT_BUDGET in choices.forward_budget_keys:
        arr.rollout.log_prob_max_token_len_per_gpu = decision.forward_budget
    if REF_BUDGET in choices.forward_budget_keys:
        arr.ref.log_prob_max_token_len_per_gpu = decision.forward_budget
    return cfg, notes + decision.notes


def resolve_critic_settings(cfg, hf_config, model_path: str, device: torch.device,
                            world_size: int) -> tuple[object, list[str]]:
    """A copy of `cfg` with the critic's open keys decided, and the log lines."""
    cfg = copy.deepcopy(cfg)
    c = cfg.critic
    choices = critic_choices(cfg, world_size // c.ulysses_sequence_parallel_size)
    decision = decide_on_device(cfg, "critic", hf_config, model_path, device, world_size, choices)
    notes = []
    if c.use_dynamic_bsz is None:
        c.use_dynamic_bsz = dynamic_batches(None, _micro(c.ppo_micro_batch_size_per_gpu, c.ppo_micro_batch_size))
        notes.append(f"critic.use_dynamic_bsz auto → {str(c.use_dynamic_bsz).lower()}")
    if choices.checkpointing is None:
        c.model.enable_gradient_checkpointing = decision.checkpointing
    if choices.update_budget_key:
        c.ppo_max_token_len_per_gpu = decision.update_budget
    if choices.forward_budget_keys:
        c.forward_max_token_len_per_gpu = decision.forward_budget
    return cfg, notes + decision.notes


def _fill_flags(cfg) -> list[str]:
    """Unset use_dynamic_bsz flags of the actor, rollout and reference: token budgets unless a micro-batch size is
    set."""
    arr = cfg.actor_rollout_ref
    notes = []
    for key, section, flag, per_gpu, global_size in (
            (ACTOR, arr.actor, "use_dynamic_bsz", "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size"),
            ("actor_rollout_ref.rollout", arr.rollout, "log_prob_use_dynamic_bsz",
             "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size"),
            ("actor_rollout_ref.ref", arr.ref, "log_prob_use_dynamic_bsz", "log_prob_micro_batch_size_per_gpu",
             "log_prob_micro_batch_size")):
        if getattr(section, flag) is None:
            if section is arr.ref and not cfg.uses_ref_log_prob_settings:
                section.log_prob_use_dynamic_bsz = False  # no reference or teacher phase runs
                continue
            value = dynamic_batches(None, _micro(getattr(section, per_gpu), getattr(section, global_size)))
            setattr(section, flag, value)
            why = "no micro-batch size set" if value else f"{key}.{per_gpu} is set"
            notes.append(f"{key}.{flag} auto → {str(value).lower()} ({why})")
    return notes


def memory_problems(cfg, world_size: int) -> list[str]:
    """The driver's check, when it sees a GPU (NVML): does the run fit an otherwise empty GPU of that size?"""
    from verlx.utils.gpu_info import visible_gpu_total_bytes

    if cfg.trainer.device == "cpu" or cfg.actor_rollout_ref.actor.strategy not in FSDP_STRATEGIES:
        return []
    total = visible_gpu_total_bytes()
    shape_cfg = read_hf_shape(cfg.actor_rollout_ref.model.path)
    if total is None or shape_cfg is None or unestimated(shape_cfg) is not None:
        return []
    memory = GpuMemory(total)
    shape = model_shape(shape_cfg, cfg.actor_rollout_ref.model.path)
    problems = []
    roles = [("actor", actor_choices)] + ([("critic", critic_choices)] if _uses_critic(cfg) else [])
    for name, choices_of in roles:
        sp = (cfg.actor_rollout_ref.actor if name == "actor" else cfg.critic).ulysses_sequence_parallel_size
        try:
            plan_role(cfg, name, shape, memory, world_size, choices_of(cfg, world_size // sp))
        except MemoryPlanError as e:
            problems.append(f"{e} (estimated in the driver for an empty GPU of {total / 2**30:.1f} GiB)")
    return problems
