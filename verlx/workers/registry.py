"""Training backend (actor_rollout_ref.actor.strategy) → its actor/rollout/ref worker class and critic worker class.

Entries are loaders, so choosing fsdp never imports megatron-core and vice versa.
"""

from __future__ import annotations

from typing import Callable

from verlx.utils.registry import Registry

WORKER_BACKENDS: Registry[Callable[[], tuple[type, type]]] = Registry(
    "training backend", "actor_rollout_ref.actor.strategy"
)


@WORKER_BACKENDS.register("fsdp")
@WORKER_BACKENDS.register("fsdp2")
def _fsdp() -> tuple[type, type]:
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
    from verlx.workers.critic_worker import CriticWorker

    return ActorRolloutRefWorker, CriticWorker


@WORKER_BACKENDS.register("megatron")
def _megatron() -> tuple[type, type]:
    from verlx.workers.megatron import require_megatron_core

    require_megatron_core()
    from verlx.workers.megatron.workers import MegatronActorRolloutRefWorker, MegatronCriticWorker

    return MegatronActorRolloutRefWorker, MegatronCriticWorker


def worker_classes(strategy: str) -> tuple[type, type]:
    """(actor/rollout/ref worker class, critic worker class) of a strategy."""
    return WORKER_BACKENDS.get(strategy)()
