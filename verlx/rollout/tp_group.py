"""A CPU (gloo) process group per rollout tensor-parallel group, for the small Python objects its ranks exchange:
device lists and addresses at start-up, CUDA-IPC handles during a weight push, generation results afterwards."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from verlx.rollout.engine_layout import EngineLayout


class TensorParallelGroup:
    def __init__(self, layout: EngineLayout, group):
        self.layout = layout
        self.group = group

    @classmethod
    def create(cls, layout: EngineLayout) -> TensorParallelGroup:
        """Collective over the whole default group: every rank creates every TP group, in the same order."""
        if layout.tp_size == 1:
            return cls(layout, None)
        if not dist.is_initialized():
            raise RuntimeError(
                "tensor-parallel rollout needs torch.distributed initialised in every worker before the engine is built"
            )
        if dist.get_world_size() != layout.world_size:
            raise RuntimeError(
                f"torch.distributed world size {dist.get_world_size()} != rollout world size {layout.world_size}"
            )
        mine = None
        for start in range(0, layout.world_size, layout.tp_size):
            ranks = list(range(start, start + layout.tp_size))
            group = dist.new_group(ranks, backend="gloo")
            if layout.rank in ranks:
                mine = group
        return cls(layout, mine)

    def all_gather(self, obj: Any) -> list[Any]:
        """Every rank's object, in tp-rank order."""
        if self.group is None:
            return [obj]
        out: list[Any] = [None] * self.layout.tp_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def gather_to_leader(self, obj: Any) -> list[Any] | None:
        """Every rank's object in tp-rank order on the leader; None elsewhere."""
        if self.group is None:
            return [obj]
        out: list[Any] | None = [None] * self.layout.tp_size if self.layout.is_leader else None
        dist.gather_object(obj, out, dst=self.layout.leader_rank, group=self.group)
        return out

    def broadcast_from_leader(self, obj: Any) -> Any:
        """The leader's object on every rank (what the others pass is ignored)."""
        if self.group is None:
            return obj
        box = [obj if self.layout.is_leader else None]
        dist.broadcast_object_list(box, src=self.layout.leader_rank, group=self.group)
        return box[0]

    def run_on_leader(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` on the leader only; every rank returns its result or raises its exception (so no peer is left
        waiting in a collective when the leader fails)."""
        if self.group is None:
            return fn()
        outcome: tuple[bool, Any] | None = None
        error: BaseException | None = None
        if self.layout.is_leader:
            try:
                outcome = (True, fn())
            except Exception as e:  # handed to the peers, re-raised below
                error = e
                outcome = (False, _picklable(e))
        ok, value = self.broadcast_from_leader(outcome)
        if error is not None:
            raise error
        if not ok:
            raise value
        return value


    def run_checked(self, fn: Callable[[], Any], what: str) -> Any:
        """Run `fn` on every rank; if it fails on any, every rank raises (its own error, or one naming the peers'
        failures), so no rank goes on with a group that is not whole. `what`: the step, in the message."""
        error: Exception | None = None
        result = None
        try:
            result = fn()
        except Exception as e:  # reported to the peers below, then re-raised
            error = e
        failures = [f for f in self.all_gather(None if error is None else f"rank {self.layout.rank}: {error}") if f]
        if error is not None:
            raise error
        if failures:
            raise RuntimeError(f"{what} failed on a tensor-parallel peer: {failures}")
        return result


def _picklable(error: BaseException) -> BaseException:
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:
        return RuntimeError(f"{type(error).__name__} on the tensor-parallel leader: {error}")
