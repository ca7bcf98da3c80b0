"""The base class every worker role derives from: identity from the environment the group sets."""

from __future__ import annotations

import faulthandler
import os
import signal
from dataclasses import dataclass

import torch

from verlx.single_controller.decorator import DEFAULT_MESH
from verlx.utils.distributed import host_rendezvous

# Sending this signal to a worker makes it write every thread's Python stack to its stack file.
STACK_DUMP_SIGNAL = signal.SIGUSR2
STACK_DIR_ENV = "VERLX_STACK_DIR"

# Each process holds the data-parallel layouts its roles declared: mesh name -> (dp_rank, dp_size, is_collect).
# It is process-wide because colocated roles share one process and one rank.
_DISPATCH_INFO: dict[str, tuple[int, int, bool]] = {}
_stack_file = None


def stack_file_path(pid: int) -> str:
    return os.path.join(os.environ.get(STACK_DIR_ENV, "/tmp/verlx-stacks"), f"{pid}.txt")


def _install_stack_dump_handler() -> None:
    """Register faulthandler on STACK_DUMP_SIGNAL so a watchdog can read this process's stacks while it is stuck."""
    global _stack_file
    if _stack_file is not None:
        return
    path = stack_file_path(os.getpid())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    _stack_file = open(path, "w")  # noqa: SIM115 - must stay open for faulthandler
    faulthandler.register(STACK_DUMP_SIGNAL, file=_stack_file, all_threads=True, chain=False)


@dataclass(frozen=True)
class WorkerIdentity:
    rank: int
    pid: int
    node_ip: str
    node_id: str


class Worker:
    """Reads RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT and picks its device."""

    def __init__(self) -> None:
        self.rank = int(os.environ.get("RANK", "0"))
        self.world_size = int(os.environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.master_addr = os.environ.get("MASTER_ADDR")
        self.master_port = os.environ.get("MASTER_PORT")
        self.device = self._pick_device()
        _DISPATCH_INFO.setdefault(DEFAULT_MESH, (self.rank, self.world_size, True))
        if self.world_size > 1 or "RANK" in os.environ:
            _install_stack_dump_handler()

    def _pick_device(self) -> torch.device:
        if not torch.cuda.is_available():
            return torch.device("cpu")
        # Ray narrows CUDA_VISIBLE_DEVICES to the actor's GPU; when it does not, LOCAL_RANK picks it.
        index = self.local_rank if torch.cuda.device_count() > 1 else 0
        torch.cuda.set_device(index)
        return torch.device("cuda", index)

    def close(self) -> None:
        """Stop what this worker started outside its process (a rollout engine's server), before its group kills
        it; nothing by default."""

    # ------------------------------------------------------------------ dispatch layout
    @staticmethod
    def set_dispatch_info(mesh: str, dp_rank: int, dp_size: int, is_collect: bool) -> None:
        """Declare this rank's place in a data-parallel layout used by DP_COMPUTE_PROTO methods of `mesh`."""
        if not 0 <= dp_rank < dp_size:
            raise ValueError(f"dp_rank {dp_rank} outside [0, {dp_size}) for mesh '{mesh}'")
        _DISPATCH_INFO[mesh] = (dp_rank, dp_size, bool(is_collect))

    def get_dispatch_info(self, mesh: str) -> tuple[int, int, bool]:
        if mesh not in _DISPATCH_INFO:
            raise KeyError(f"rank {self.rank} never declared its place in mesh '{mesh}' (set_dispatch_info)")
        return _DISPATCH_INFO[mesh]

    # ------------------------------------------------------------------ group plumbing
    def get_identity(self) -> WorkerIdentity:
        import ray

        ctx = ray.get_runtime_context()
        return WorkerIdentity(self.rank, os.getpid(), self.node_ip(), ctx.get_node_id())

    @staticmethod
    def node_ip() -> str:
        """The IP address of this worker's node, as the Ray cluster knows it."""
        import ray

        return ray.util.get_node_ip_address()

    def pick_master_address(self) -> tuple[str, int]:
        """This node's IP and the port of the torch.distributed rendezvous rank 0 hosts from now on."""
        port = host_rendezvous()
        addr = self.node_ip()
        self.set_master_address(addr, port)
        return addr, port

    def set_master_address(self, addr: str, port: int) -> None:
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = addr, str(port)
        self.master_addr, self.master_port = addr, str(port)
