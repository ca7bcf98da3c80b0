"""The rollout worker group of actor_rollout_ref.hybrid_engine=false: engines in processes of their own
(rollout.nnodes × rollout.n_gpus_per_node), fed with the trainer's weights by broadcast (workers/weight_transfer).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from verlx.protocol import DataProto
from verlx.single_controller.ray import RayClassWithInitArgs, RayResourcePool
from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker, WorkerRole
from verlx.workers.groups import ActorRolloutRefGroup

logger = logging.getLogger(__name__)


class RolloutGroup:
    """Generation on the rollout workers; `version` is the policy version their engines hold (None: none yet).

    `trainer` is the trainer's actor view (it sends the weights), `trainer_version` returns the version the trainer
    holds now. `generate_sequences` (the worker group's signature, used by sync-mode steps and validation) first
    brings the engines to the trainer's version."""

    def __init__(self, config, use_gpu: bool, trainer, trainer_version: Callable[[], int]):
        r, t = config.rollout, config.trainer
        self.trainer, self.trainer_version = trainer, trainer_version
        self.pool = RayResourcePool([r.n_gpus_per_node] * r.nnodes, use_gpu=use_gpu, name_prefix="verlx_rollout")
        worker = RayClassWithInitArgs(ActorRolloutRefWorker, config=config, role=WorkerRole(rollout=True))
        if t.partial_rollout:
            worker.with_concurrency(2)  # interrupt_generation runs beside generate_sequences
        self.wg = ActorRolloutRefGroup(self.pool, worker, name="rollout")
        self.wg.set_timeouts(t.phase_timeout_s, **t.phase_timeouts)
        self.wg.init_model()
        host, port = next(address for address in trainer.weight_transfer_address() if address is not None)
        world = 1 + self.wg.world_size
        joins = [trainer.join_weight_transfer(host, port, world), self.wg.join_weight_transfer(host, port, world)]
        for future in joins:
            future.get()
        self.version: int | None = None
        self.sync_seconds = 0.0  # weight syncs since the last take_sync_seconds()
        logger.info("rollout worker group: %s; weights broadcast from trainer rank 0 (%s:%d)",
                    self.wg.placement(), host, port)

    def sync_weights(self, version: int, timeout_s: float | None = None) -> None:
        """Broadcast the trainer's weights (policy `version`) into every rollout engine; the trainer and the rollout
        group must both be idle."""
        start = time.perf_counter()
        sent, received = self.trainer.send_weights(version), self.wg.receive_weights(version)
        sent.get(timeout_s)
        received.get(timeout_s)
        self.version = version
        self.sync_seconds += time.perf_counter() - start

    def take_sync_seconds(self) -> float:
        seconds, self.sync_seconds = self.sync_seconds, 0.0
        return seconds

    def ensure_current(self) -> None:
        if self.version != self.trainer_version():
            self.sync_weights(self.trainer_version())

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.ensure_current()
        return self.wg.generate_sequences(prompts)

    def shutdown(self) -> None:
        self.wg.shutdown()
        self.pool.release()
