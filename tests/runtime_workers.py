"""Worker classes the runtime tests run inside real Ray actors."""

from __future__ import annotations

import os
import time

import torch

from verlx.protocol import DataProto
from verlx.single_controller import Dispatch, Worker, register
from verlx.single_controller.ray import RayWorkerGroup, group_method


class EchoWorker(Worker):
    """Records what reached which rank."""

    def __init__(self, tag: str = "echo", close_marker: str | None = None):
        super().__init__()
        self.tag = tag
        self.state = 0
        self.close_marker = close_marker

    def close(self) -> None:
        """Leaves `<close_marker>.<rank>` behind, for a test of the group's shutdown."""
        if self.close_marker:
            open(f"{self.close_marker}.{self.rank}", "w").close()

    @register(Dispatch.ONE_TO_ALL)
    def whoami(self, suffix: str):
        return {"rank": self.rank, "world": self.world_size, "pid": os.getpid(), "tag": self.tag + suffix,
                "master": (self.master_addr, self.master_port), "local_rank": self.local_rank}

    @register(Dispatch.ONE_TO_ALL)
    def environment(self, names: list[str]) -> list[str | None]:
        return [os.environ.get(name) for name in names]

    @register(Dispatch.ONE_TO_ALL)
    def add(self, value: int):
        self.state += value
        return self.state

    @register(Dispatch.DP_COMPUTE)
    def take_mine(self, item):
        return (self.rank, item)

    @register(Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto) -> DataProto:
        out = DataProto({"x2": data.batch["x"] * 2, "seen_by": torch.full((len(data),), self.rank)})
        return out

    @register(Dispatch.RANK_ZERO)
    def only_zero(self):
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def sleep(self, seconds: float):
        time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def sleep_span(self, seconds: float):
        """When this rank's sleep began and ended (CLOCK_MONOTONIC: one clock for every process of the host)."""
        start = time.monotonic()
        time.sleep(seconds)
        return start, time.monotonic()

    @register(Dispatch.ONE_TO_ALL)
    def peer_dies_after_error(self, victim: int, delay_s: float):
        """`victim` exits hard `delay_s` after the others fail: the order in which a survivor's collective error
        (gloo's "connection reset by peer") can reach the driver before the death does."""
        if self.rank == victim:
            time.sleep(delay_s)
            os._exit(1)
        raise RuntimeError("Read error: Connection reset by peer")

    @register(Dispatch.ONE_TO_ALL)
    def fail_on(self, rank: int):
        if self.rank == rank:
            raise ValueError(f"deliberate failure on rank {rank}")
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def die_on(self, rank: int, after_s: float = 0.0):
        time.sleep(after_s)
        if self.rank == rank:
            os._exit(1)
        time.sleep(60)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def hang_in_function_named_stuck_here(self, seconds: float):
        time.sleep(seconds)
        return self.rank

    @register(Dispatch.ONE_TO_ALL)
    def all_reduce(self, value: float):
        import torch.distributed as dist

        from verlx.utils.distributed import init_distributed

        init_distributed(timeout_s=60)
        t = torch.tensor([value * (self.rank + 1)])
        dist.all_reduce(t)
        return float(t.item())


class TensorParallelWorker(Worker):
    """Pairs of ranks form a TP group: both get the same shard, only the first returns it."""

    def __init__(self, tp: int = 2):
        super().__init__()
        self.set_dispatch_info("rollout", self.rank // tp, self.world_size // tp, self.rank % tp == 0)

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="rollout")
    def tag(self, data: DataProto) -> DataProto:
        return DataProto({"x": data.batch["x"], "rank": torch.full((len(data),), self.rank)})


class CriticLikeWorker(Worker):
    def __init__(self, scale: int):
        super().__init__()
        self.scale = scale
        self.calls = 0

    @register(Dispatch.ONE_TO_ALL)
    def pid_and_calls(self):
        self.calls += 1
        return os.getpid(), self.calls, self.scale

    @register(Dispatch.DP_COMPUTE_PROTO)
    def scaled(self, data: DataProto) -> DataProto:
        return DataProto({"y": data.batch["x"] * self.scale})


class EchoGroup(RayWorkerGroup):
    whoami = group_method(EchoWorker.whoami)
    environment = group_method(EchoWorker.environment)
    add = group_method(EchoWorker.add)
    take_mine = group_method(EchoWorker.take_mine)
    double = group_method(EchoWorker.double)
    only_zero = group_method(EchoWorker.only_zero)
    sleep = group_method(EchoWorker.sleep)
    sleep_span = group_method(EchoWorker.sleep_span)
    peer_dies_after_error = group_method(EchoWorker.peer_dies_after_error)
    fail_on = group_method(EchoWorker.fail_on)
    die_on = group_method(EchoWorker.die_on)
    hang_in_function_named_stuck_here = group_method(EchoWorker.hang_in_function_named_stuck_here)
    all_reduce = group_method(EchoWorker.all_reduce)


class TensorParallelGroup(RayWorkerGroup):
    tag = group_method(TensorParallelWorker.tag)


class CriticLikeGroup(RayWorkerGroup):
    pid_and_calls = group_method(CriticLikeWorker.pid_and_calls)
    scaled = group_method(CriticLikeWorker.scaled)
