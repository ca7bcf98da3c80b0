"""What a run asks of its rollout engine, checked before Ray against what the engine's class declares
(RolloutEngine.supports_* and tensor_parallel_in_lockstep): each refusal names the engine, the capability and the
key that needs it."""

from __future__ import annotations

import os

from verlx.models.checkpoint_config import position_limit, read_checkpoint_config
from verlx.models.vision import checkpoint_model_type

ROLLOUT = "actor_rollout_ref.rollout"


def engine_class_or_none(name: str):
    """The engine class of a registered name or `module:Class`, None for `auto` (resolved later) or a name that
    does not resolve (reported by the name checks)."""
    from verlx.rollout.base import ROLLOUT_ENGINES

    if name == "auto":
        return None
    try:
        return ROLLOUT_ENGINES.get(name)
    except (KeyError, ValueError):
        return None


def capability_problems(cfg, name: str | None = None) -> list[str]:
    """The capabilities the config needs that rollout.name (or `name`, once `auto` is resolved) lacks."""
    rollout = cfg.actor_rollout_ref.rollout
    name = name or rollout.name
    engine = engine_class_or_none(name)
    if engine is None:
        return []
    needs = _needs(cfg)
    problems = []
    for capability, (key, what) in needs.items():
        if not getattr(engine, capability, False):
            problems.append(f"{key} needs a rollout engine that {what}, but {ROLLOUT}.name={name} cannot "
                            f"({engine.__name__}.{capability} is False); use {alternatives(capability)}")
    tp = rollout.tensor_model_parallel_size
    if rollout.server.enable:
        problems += _server_problems(cfg, tp)
    if tp > 1 and not engine.supports_tensor_parallel:
        problems.append(f"{ROLLOUT}.tensor_model_parallel_size={tp} needs a rollout engine that shards a replica over "
                        f"several GPUs, but {ROLLOUT}.name={name} cannot ({engine.__name__}.supports_tensor_parallel "
                        f"is False); set it to 1 (each GPU then generates its own data-parallel shard) or use "
                        f"{alternatives('supports_tensor_parallel')}")
    # in server mode a group's first rank drives its server alone: no peers to keep in step
    if engine.tensor_parallel_in_lockstep and tp > 1 and not rollout.server.enable:
        independent = [n for n in _able("supports_tensor_parallel") if n in _able("tensor_parallel_in_lockstep", False)]
        server = (f"set {ROLLOUT}.server.enable=true (the group's first rank alone drives the engine's server), "
                  if engine.supports_server else "")
        for key in _timing_dependent(cfg):
            problems.append(f"{key} with {ROLLOUT}.name={name} needs {ROLLOUT}.tensor_model_parallel_size=1 (got "
                            f"{tp}): the engine's tensor-parallel peers must receive the same requests in the same "
                            f"order, which requests that depend on timing (tool calls, interruptions) break; {server}"
                            "or use " + " or ".join(f"{ROLLOUT}.name={n}" for n in independent))
    return problems


def model_config_problems(cfg, name: str | None = None) -> list[str]:
    """What in the model's config.json the engine will refuse, on every rank and after minutes of loading: its own
    checkpoint requirements (RolloutEngine.checkpoint_problems) and, for vLLM and SGLang, a context longer than
    max_position_embeddings. Read from the file before Ray; none for a path without one (a hub id not yet
    downloaded: checked again once it is)."""
    rollout = cfg.actor_rollout_ref.rollout
    name = name or rollout.name
    engine = engine_class_or_none(name)
    path = cfg.actor_rollout_ref.model.path
    raw = read_checkpoint_config(path) if engine is not None else None
    if raw is None:
        return []
    problems = [f"actor_rollout_ref.model.path: {path}/config.json {problem}; {ROLLOUT}.name={name} cannot load it "
                "otherwise" for problem in engine.checkpoint_problems(raw)]
    override = engine.context_limit_override_env
    limit = position_limit(raw)
    longest = rollout.max_model_len or rollout.prompt_length + rollout.response_length
    if override is None or os.environ.get(override) or limit is None or longest + engine.context_length_margin <= limit:
        return problems
    asked = (f"{ROLLOUT}.max_model_len={rollout.max_model_len}" if rollout.max_model_len else
             f"data.max_prompt_length + data.max_response_length = {rollout.prompt_length} + "
             f"{rollout.response_length} = {longest} tokens")
    margin = (f" (+ {engine.context_length_margin} tokens {name} needs beyond the longest sequence)"
              if engine.context_length_margin else "")
    return problems + [
        f"{asked}{margin} exceeds the model's max_position_embeddings={limit} in {path}/config.json, and "
        f"{ROLLOUT}.name={name} refuses a longer context: shorten the prompts or responses, use a model (or a "
        f"rope_scaling) made for longer sequences, or set {override}=1 if positions beyond {limit} are what you want"]


def _server_problems(cfg, tp: int) -> list[str]:
    """A server is one process on one node: its tensor-parallel group must fit the node."""
    colocated = cfg.actor_rollout_ref.hybrid_engine
    key = "trainer.n_gpus_per_node" if colocated else "rollout.n_gpus_per_node"
    gpus = cfg.trainer.n_gpus_per_node if colocated else cfg.rollout.n_gpus_per_node
    if tp <= gpus:
        return []
    return [f"{ROLLOUT}.server.enable=true with {ROLLOUT}.tensor_model_parallel_size={tp} > {key}={gpus}: an engine "
            "server runs on one node, so its tensor-parallel group must fit one; lower tensor_model_parallel_size or "
            "turn server mode off"]


def _needs(cfg) -> dict[str, tuple[str, str]]:
    from verlx.algorithms.advantages import estimator_needs_greedy_baseline

    needs = {}
    try:
        if estimator_needs_greedy_baseline(cfg.algorithm.adv_estimator):
            needs["supports_greedy"] = (f"algorithm.adv_estimator={cfg.algorithm.adv_estimator} (a greedy "
                                        "baseline)", "decodes greedily")
    except KeyError:
        pass  # an unknown estimator is reported by the name checks
    if cfg.trainer.partial_rollout:
        needs["supports_partial_rollout"] = ("trainer.partial_rollout=true", "can pause a generation and continue "
                                             "it with new weights")
    if cfg.actor_rollout_ref.rollout.server.enable:
        needs["supports_server"] = (f"{ROLLOUT}.server.enable=true", "serves its requests from an HTTP server")
    model_type = checkpoint_model_type(cfg.actor_rollout_ref.model.path)
    if model_type is not None:
        model = f"actor_rollout_ref.model.path (a vision-language model, {model_type})"
        needs["supports_image_input"] = (model, "takes image inputs (vision-language models; the native engine "
                                         "does not support them)")
        if cfg.actor_rollout_ref.rollout.server.enable:
            needs["supports_server_image_input"] = (f"{model} with {ROLLOUT}.server.enable=true",
                                                    "takes image inputs in server mode (vLLM's server mode does not "
                                                    "support them)")
    return needs


def _timing_dependent(cfg) -> list[str]:
    keys = []
    if cfg.actor_rollout_ref.rollout.multi_turn.enable:
        keys.append(f"{ROLLOUT}.multi_turn.enable=true")
    if cfg.trainer.partial_rollout:
        keys.append("trainer.partial_rollout=true")
    return keys


def _able(capability: str, wanted: bool = True) -> list[str]:
    """The registered engines whose class declares `capability` as `wanted`."""
    from verlx.rollout.base import ROLLOUT_ENGINES

    return [n for n in ROLLOUT_ENGINES.names() if getattr(ROLLOUT_ENGINES.get(n), capability, False) == wanted]


def alternatives(capability: str) -> str:
    """`rollout.name=a or rollout.name=b`: the registered engines that declare `capability`."""
    return " or ".join(f"{ROLLOUT}.name={n}" for n in _able(capability)) or "another engine"
