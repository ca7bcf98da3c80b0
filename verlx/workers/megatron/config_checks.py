"""Checks of a strategy=megatron config, run by config validation before Ray starts (no megatron-core import)."""

from __future__ import annotations

import json
import os

from verlx.algorithms.advantages import uses_critic
from verlx.config.loader import Findings
from verlx.utils.paths import expand_path
from verlx.workers.megatron import INSTALL_COMMAND, megatron_core_available
from verlx.workers.megatron.architectures import ARCHITECTURES
from verlx.workers.megatron.parallel import check_layout

_SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
          "virtual_pipeline_model_parallel_size")


def _model_shape(path: str) -> dict | None:
    config_file = os.path.join(expand_path(path), "config.json")
    if not os.path.isfile(config_file):
        return None  # reported by the path checks
    with open(config_file) as f:
        raw = json.load(f)
    heads = raw.get("num_attention_heads")
    return {"architectures": raw.get("architectures") or [], "num_heads": heads,
            "num_kv_heads": raw.get("num_key_value_heads") or heads, "num_layers": raw.get("num_hidden_layers")}


def megatron_problems(cfg, world_size: int, megatron_installed: bool | None = None) -> list[str]:
    """Every problem of the megatron parts of `cfg` (a PPOConfig); empty when no role uses megatron."""
    arr = cfg.actor_rollout_ref
    critic = uses_critic(cfg)
    actor_meg = arr.actor.strategy == "megatron"
    critic_meg = critic and cfg.critic.strategy == "megatron"
    if not (actor_meg or critic_meg):
        return []
    installed = megatron_core_available() if megatron_installed is None else megatron_installed
    f = Findings()
    f.require(installed, f"strategy=megatron needs megatron-core, which is not installed; install it with: "
              f"{INSTALL_COMMAND}")
    f.require(not critic or actor_meg == critic_meg,
              f"actor_rollout_ref.actor.strategy={arr.actor.strategy} but critic.strategy={cfg.critic.strategy}: "
              "colocated roles must use the same backend when one is megatron")
    roles = []
    if actor_meg:
        roles.append(("actor_rollout_ref.actor.megatron", arr.actor.megatron, arr.model.path))
        if cfg.use_reference:
            roles.append(("actor_rollout_ref.ref.megatron", arr.ref.megatron, arr.model.path))
    if critic_meg:
        roles.append(("critic.megatron", cfg.critic.megatron, cfg.critic.model.path or arr.model.path))
    for key, m, path in roles:
        _check_role(key, m, path, world_size, f)
    if actor_meg:
        f.problems += _exact_kl_problems(cfg)
    first_key, first, _ = roles[0]
    for key, m, _ in roles[1:]:
        differing = [s for s in _SIZES if getattr(m, s) != getattr(first, s)]
        f.require(not differing, f"{key} differs from {first_key} in {differing}: megatron keeps one parallel layout "
                  "per process, so colocated roles must use the same sizes")
    return f.problems


def _check_role(key: str, m, path: str, world_size: int, f: Findings) -> None:
    """One role's megatron section: a converter for the model's architecture, a layout that fits, dense only."""
    shape = _model_shape(path) or {}
    archs = shape.pop("architectures", [])
    for arch in archs[:1]:
        f.require(arch in ARCHITECTURES, f"{key}: the model at {path} is a {arch}, which has no megatron converter; "
                  f"supported architectures: {', '.join(ARCHITECTURES.names())}")
    f.problems += check_layout(world_size, m.tensor_model_parallel_size, m.pipeline_model_parallel_size,
                               m.context_parallel_size, m.virtual_pipeline_model_parallel_size, key=key, **shape)
    for flag in ("param_offload", "grad_offload", "optimizer_offload"):
        f.require(not getattr(m, flag), f"{key}.{flag}=true is not supported by the megatron backend yet; set it to "
                  "false")
    f.require(m.expert_model_parallel_size == 1, f"{key}.expert_model_parallel_size={m.expert_model_parallel_size}: "
              "only dense models are supported; set it to 1")


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
