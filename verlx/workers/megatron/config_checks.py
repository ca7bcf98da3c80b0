"""Checks of a strategy=megatron config, run by config validation before Ray starts.

Nothing here builds a model; megatron-core is imported only to read its config dataclasses' field names (for the
override sections' did-you-mean), when it is installed.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass

from verlx.algorithms.advantages import uses_critic
from verlx.config.loader import Findings
from verlx.utils.paths import expand_path
from verlx.workers.auto_settings import EXPERT_FIELDS
from verlx.workers.megatron import INSTALL_COMMAND, megatron_core_available, transformer_engine_available
from verlx.workers.megatron.architectures import ARCHITECTURES
from verlx.workers.megatron.overrides import (
    ddp_override_problems,
    optimizer_override_problems,
    stage_layer_overrides,
    transformer_override_problems,
)
from verlx.workers.megatron.parallel import check_layout
from verlx.workers.megatron.schedule import style_problems

_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
          "virtual_pipeline_model_parallel_size", "expert_model_parallel_size", "expert_tensor_parallel_size")


@dataclass
class _Role:
    key: str  # e.g. actor_rollout_ref.actor.megatron
    megatron: object
    model_path: str
    optim: object | None  # None for the reference
    optim_key: str = ""


def _model_shape(path: str) -> dict | None:
    config_file = os.path.join(expand_path(path), "config.json")
    if not os.path.isfile(config_file):
        return None  # reported by the path checks
    with open(config_file) as f:
        raw = json.load(f)
    heads = raw.get("num_attention_heads")
    return {"architectures": raw.get("architectures") or [], "num_heads": heads,
            "num_kv_heads": raw.get("num_key_value_heads") or heads, "num_layers": raw.get("num_hidden_layers"),
            "num_experts": next((raw[k] for k in EXPERT_FIELDS if raw.get(k)), 0),
            "moe_ffn_hidden_size": raw.get("moe_intermediate_size")}


def _fields(module: str, name: str) -> set[str] | None:
    """A megatron-core config dataclass's field names, or None when megatron-core is not installed."""
    if not megatron_core_available():
        return None
    import importlib

    return {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), name))}


def megatron_findings(cfg, world_size: int, megatron_installed: bool | None = None) -> Findings:
    """Problems and warnings of the megatron parts of `cfg` (a PPOConfig); empty when no role uses megatron."""
    arr = cfg.actor_rollout_ref
    critic = uses_critic(cfg)
    actor_meg = arr.actor.strategy == "megatron"
    critic_meg = critic and cfg.critic.strategy == "megatron"
    f = Findings()
    if not (actor_meg or critic_meg):
        return f
    installed = megatron_core_available() if megatron_installed is None else megatron_installed
    f.require(installed, f"strategy=megatron needs megatron-core, which is not installed; install it with: "
              f"{INSTALL_COMMAND}")
    f.require(not critic or actor_meg == critic_meg,
              f"actor_rollout_ref.actor.strategy={arr.actor.strategy} but critic.strategy={cfg.critic.strategy}: "
              "colocated roles must use the same backend when one is megatron")
    roles = []
    if actor_meg:
        roles.append(_Role("actor_rollout_ref.actor.megatron", arr.actor.megatron, arr.model.path, arr.actor.optim,
                           "actor_rollout_ref.actor.optim"))
        if cfg.use_reference:
            roles.append(_Role("actor_rollout_ref.ref.megatron", arr.ref.megatron, arr.model.path, None))
    if critic_meg:
        roles.append(_Role("critic.megatron", cfg.critic.megatron, cfg.critic.model.path or arr.model.path,
                           cfg.critic.optim, "critic.optim"))
    for role in roles:
        _check_role(role, world_size, f)
        tp, per_node = role.megatron.tensor_model_parallel_size, cfg.trainer.n_gpus_per_node
        f.require(tp < 1 or per_node % tp == 0, f"{role.key}.tensor_model_parallel_size={tp} does not divide "
                  f"trainer.n_gpus_per_node={per_node}: tensor-parallel groups would straddle nodes (their all-reduces "
                  f"run every layer); use a divisor of {per_node}")
    if actor_meg:
        f.problems += _exact_kl_problems(cfg)
    first = roles[0]
    for role in roles[1:]:
        differing = [s for s in _SIZES if getattr(role.megatron, s) != getattr(first.megatron, s)]
        f.require(not differing, f"{role.key} differs from {first.key} in {differing}: megatron keeps one parallel "
                  "layout per process, so colocated roles must use the same sizes")
    return f


def megatron_problems(cfg, world_size: int, megatron_installed: bool | None = None) -> list[str]:
    return megatron_findings(cfg, world_size, megatron_installed).problems


def _check_role(role: _Role, world_size: int, f: Findings) -> None:
    """One role's megatron section: a converter for the model's architecture, a layout that fits, the keys it sets."""
    key, m = role.key, role.megatron
    shape = _model_shape(role.model_path) or {}
    archs = shape.pop("architectures", [])
    for arch in archs[:1]:
        f.require(arch in ARCHITECTURES, f"{key}: the model at {role.model_path} is a {arch}: verlx's megatron engine "
                  f"does not support that architecture yet (no converter); it supports "
                  f"{', '.join(ARCHITECTURES.names())}, and strategy=fsdp trains any architecture transformers has")
    experts, moe_ffn = shape.pop("num_experts", 0), shape.pop("moe_ffn_hidden_size", None)
    f.problems += check_layout(world_size, m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                               m.context_parallel_size, m.virtual_pipeline_model_parallel_size, key=key,
                               **stage_layer_overrides(m.override_transformer_config), **shape)
    f.require(m.context_parallel_size == 1,
              f"{key}.context_parallel_size={m.context_parallel_size}: verlx's megatron backend does not split "
              "sequences over context-parallel ranks (megatron-core 0.16 offers context parallelism only inside "
              "transformer-engine's attention); set it to 1")
    _check_experts(key, m, experts, moe_ffn, world_size, f)
    te = _check_transformer_engine(key, m, f)
    f.require(not (experts and te), f"{key}: the model is a mixture of experts, which verlx converts for megatron's "
              "local layers only; set use_transformer_engine=false")
    f.problems += transformer_override_problems(
        key, m.override_transformer_config, te,
        _fields("megatron.core.transformer.transformer_config", "TransformerConfig"))
    f.problems += ddp_override_problems(key, m.override_ddp_config,
                                        _fields("megatron.core.distributed", "DistributedDataParallelConfig"))
    if m.use_dist_checkpointing:
        f.require(bool(m.dist_checkpointing_path), f"{key}.use_dist_checkpointing=true needs "
                  f"{key}.dist_checkpointing_path (a megatron dist-checkpoint directory)")
    if role.optim is not None:
        _check_optim(role.optim_key, role.optim, te, f)


def _check_transformer_engine(key: str, m, f: Findings) -> bool:
    """Whether the role builds transformer-engine layers; use_transformer_engine=true without it is refused."""
    setting = str(m.use_transformer_engine).lower()
    if not f.require(setting in ("auto", "true", "false"),
                     f"{key}.use_transformer_engine={m.use_transformer_engine!r}: use auto, true or false"):
        return False
    installed = transformer_engine_available()
    f.require(setting != "true" or installed, f"{key}.use_transformer_engine=true but transformer-engine is not "
              "installed; install it, or set use_transformer_engine=auto to use verlx's pure-torch layers")
    return installed and setting != "false"


def _check_experts(key: str, m, experts: int, moe_ffn: int | None, world_size: int, f: Findings) -> None:
    """Expert parallel sizes: applied to mixture-of-experts models, without effect (a warning) on dense ones."""
    ep, etp = m.expert_model_parallel_size, m.expert_tensor_parallel_size
    if not experts:
        if ep != 1 or etp not in (None, m.tensor_model_parallel_size):
            f.warnings.append(f"{key}.expert_model_parallel_size={ep} / expert_tensor_parallel_size={etp}: the model "
                              "has no experts, so they have no effect")
        return
    etp = etp or m.tensor_model_parallel_size
    f.require(ep >= 1 and etp >= 1, f"{key}: expert_model_parallel_size={ep} and expert_tensor_parallel_size={etp} "
              "must be >= 1")
    if ep < 1 or etp < 1:
        return
    f.require(experts % ep == 0, f"{key}.expert_model_parallel_size={ep} does not divide the model's {experts} "
              "experts")
    group = etp * ep * m.pipeline_model_parallel_size
    f.require(world_size % group == 0, f"{key}: expert_tensor_parallel_size × expert_model_parallel_size × "
              f"pipeline_model_parallel_size = {etp}×{ep}×{m.pipeline_model_parallel_size} = {group} does not "
              f"divide the world size {world_size}")
    if moe_ffn:
        f.require(moe_ffn % etp == 0, f"{key}.expert_tensor_parallel_size={etp} does not divide the model's "
                  f"moe_intermediate_size={moe_ffn}")


def _check_optim(key: str, optim, te: bool, f: Findings) -> None:
    f.problems += optimizer_override_problems(key.removesuffix(".optim"), optim.override_optimizer_config, te,
                                              _fields("megatron.core.optimizer", "OptimizerConfig"))
    if optim.lr_decay_style is None:
        return
    f.problems += style_problems(key, optim)
    schedule = optim.warmup_style or optim.lr_scheduler_type
    f.require(schedule == "constant", f"{key}.lr_scheduler_type={schedule} and {key}.lr_decay_style="
              f"{optim.lr_decay_style} both set a schedule; with strategy=megatron lr_decay_style (megatron's "
              "scheduler) is used: remove lr_scheduler_type, or set lr_decay_style=null to use it")


def _exact_kl_problems(cfg) -> list[str]:
    """The exact (full-vocabulary) KL needs the reference's hidden states next to the policy's: fsdp only."""
    arr, algorithm = cfg.actor_rollout_ref, cfg.algorithm
    uses = []
    if arr.actor.use_kl_loss and arr.actor.kl_loss_type == "full":
        uses.append("actor_rollout_ref.actor.kl_loss_type=full")
    if algorithm.use_kl_in_reward and algorithm.kl_penalty == "full":
        uses.append("algorithm.kl_penalty=full")
    return [f"{use} (the exact KL over the full vocabulary) needs actor_rollout_ref.actor.strategy=fsdp; the megatron "
            "engine computes KLs from sampled tokens: use low_var_kl, kl, mse or abs" for use in uses]


def model_parallel_size(role_cfg) -> int:
    """GPUs that share one data-parallel shard of a megatron role."""
    m = role_cfg.megatron
    return m.tensor_model_parallel_size * m.pipeline_model_parallel_size * m.context_parallel_size
