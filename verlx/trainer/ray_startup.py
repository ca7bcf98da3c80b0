"""What the Ray entry points (main_ppo, main_generation) do before their workers start: pick the device, start Ray."""

from __future__ import annotations

import os

from verlx.utils.device import resolve_device


def use_gpus(config) -> bool:
    """True when the workers get GPUs. trainer.device=cuda on a machine without one falls back to CPU workers (and
    trainer.device is set to what runs)."""
    t = config.trainer
    t.device = resolve_device(t.device, cpu_fallback=f"with {t.n_gpus_per_node} worker processes per node "
                              "(trainer.n_gpus_per_node)").type
    return t.device == "cuda"


def start_ray(config, use_gpu: bool) -> None:
    """ray.init from ray_kwargs.ray_init (an address joins a cluster), with the workers' environment."""
    import ray

    if ray.is_initialized():
        return
    init = config.ray_kwargs.ray_init
    env = {"TOKENIZERS_PARALLELISM": "false", "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
           **{k: v for k, v in os.environ.items() if k.startswith("VERLX_PROFILE_")}}  # workers/profiling.py
    kwargs = {"runtime_env": {"env_vars": env}, "include_dashboard": False}
    if init.address:
        kwargs["address"] = init.address
    else:
        workers = config.trainer.n_gpus_per_node * config.trainer.nnodes
        if not config.actor_rollout_ref.hybrid_engine:  # the rollout worker group of its own
            workers += config.rollout.n_gpus_per_node * config.rollout.nnodes
        kwargs["num_cpus"] = init.num_cpus or max(os.cpu_count() or 1, workers + 1)
    ray.init(**kwargs)
