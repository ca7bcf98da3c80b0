"""What the Ray entry points (main_ppo, main_generation) do before their workers start: pick the device, start Ray.

A run joins a Ray cluster only when pointed at one: `ray_kwargs.ray_init.address`, else the RAY_ADDRESS variable
(`ray job submit` and shells of `ray start` clusters set it). Otherwise it starts a private Ray instance sized for
its workers, beside any cluster this machine may also run. The log says which.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading

from verlx.rollout.engine_ports import BASE_PORT_ENV, free_base_port
from verlx.utils.device import resolve_device

logger = logging.getLogger("verlx")


def use_gpus(config) -> bool:
    """True when the workers get GPUs. trainer.device=cuda on a machine without one falls back to CPU workers (and
    trainer.device is set to what runs)."""
    t = config.trainer
    t.device = resolve_device(t.device, cpu_fallback=f"with {t.n_gpus_per_node} worker processes per node "
                              "(trainer.n_gpus_per_node)").type
    return t.device == "cuda"


def cluster_address(config) -> tuple[str, str] | None:
    """(address, where it came from) of the Ray cluster to join, or None for a private instance."""
    if config.ray_kwargs.ray_init.address:
        return config.ray_kwargs.ray_init.address, "ray_kwargs.ray_init.address"
    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"], "the RAY_ADDRESS environment variable"
    return None


def _worker_env() -> dict[str, str]:
    env = {"TOKENIZERS_PARALLELISM": "false", "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"),
           "HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error",
           **{k: v for k, v in os.environ.items() if k.startswith("VERLX_PROFILE_")}}  # workers/profiling.py
    if os.environ.get("PYTHONPATH"):  # a cluster's raylets did not inherit the driver's environment
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    return env


def start_ray(config, use_gpu: bool) -> None:
    """ray.init with ray_init_kwargs(config): join the cluster `cluster_address` names, or start a private instance
    for this run's workers."""
    import ray

    if ray.is_initialized():
        return
    _init_keeping_sigterm_handler(ray, ray_init_kwargs(config))


def ray_init_kwargs(config) -> dict:
    """ray.init's arguments from ray_kwargs.ray_init: its runtime_env on top of the workers' environment (its
    env_vars winning; the rollout engines' base port free on this host unless set: rollout/engine_ports.py), then
    the cluster to join, or a private instance's num_cpus (at least one per worker process)
    and num_gpus."""
    init = config.ray_kwargs.ray_init
    workers = config.trainer.n_gpus_per_node * config.trainer.nnodes
    if not config.actor_rollout_ref.hybrid_engine:  # the rollout worker group of its own
        workers += config.rollout.n_gpus_per_node * config.rollout.nnodes
    runtime_env = dict(init.runtime_env)
    runtime_env["env_vars"] = {**_worker_env(),
                               **{str(k): _env_value(v) for k, v in (init.runtime_env.get("env_vars") or {}).items()}}
    runtime_env["env_vars"].setdefault(BASE_PORT_ENV, os.environ.get(BASE_PORT_ENV) or str(free_base_port(workers)))
    kwargs = {"runtime_env": runtime_env, "include_dashboard": False}
    joined = cluster_address(config)
    if joined:
        address, source = joined
        for key in ("num_cpus", "num_gpus"):
            if getattr(init, key) is not None:
                logger.warning("ray_kwargs.ray_init.%s=%s is ignored: a cluster's resources are set by its "
                               "`ray start` commands", key, getattr(init, key))
        kwargs["address"] = address
        logger.info("joining the Ray cluster at %s (from %s)", address, source)
    else:
        # "local": a new instance even where `ray start` left a cluster this machine would otherwise connect to
        kwargs.update(address="local", num_cpus=init.num_cpus or max(os.cpu_count() or 1, workers + 1))
        logger.info("starting a private Ray instance with %d CPUs (set ray_kwargs.ray_init.address or RAY_ADDRESS "
                    "to join a running cluster)", kwargs["num_cpus"])
        if init.num_gpus is not None:
            kwargs["num_gpus"] = init.num_gpus
    return kwargs


def _env_value(value) -> str:
    """An environment value as the user wrote it (Hydra reads `true` as a boolean)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def _init_keeping_sigterm_handler(ray, kwargs: dict) -> None:
    """ray.init replaces the driver's SIGTERM handler with sys.exit(15): a silent exit with status 15. The command's
    own handler (trainer/stop_signals.py: a message, clean-up, 143) is put back."""
    own = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    ray.init(**kwargs)
    if own is not None:
        signal.signal(signal.SIGTERM, own)


def shutdown_ray() -> None:
    """ray.shutdown(), without Ray's wait of up to a second per process for a SIGTERM they never see (main_ppo starts
    a private instance's processes with the stop signals blocked: 5 s at the end of every run): the driver's
    children that run Ray's own programs are sent SIGKILL first, where Ray's wait ends anyway. A joined cluster's
    processes are not the driver's children; other children (a reward function's process pool) are left to their
    owners."""
    import psutil
    import ray

    ray_dir = os.path.dirname(os.path.abspath(ray.__file__)) + os.sep
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            if any(arg.startswith(ray_dir) and arg.endswith(".py") for arg in child.cmdline()):
                child.kill()
    ray.shutdown()
