"""torch.distributed set-up from the environment the worker group provides."""

from __future__ import annotations

import datetime
import os
import random
import socket

import torch
import torch.distributed as dist

#: where free_port looks: below Linux's default ephemeral range (32768-60999), whose ports the OS hands to every
#: outgoing connection of any process, so a port found free there can be taken before the rendezvous binds it
#: (EADDRINUSE, seen in CI beside Ray's connections)
LISTEN_PORTS = range(20000, 32000)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a one-machine rendezvous), outside the ephemeral
    range where the OS would not give it to a connection meanwhile; an OS-given one if that range seems full."""
    rng = random.Random()  # seeded by the OS: the global one is seeded by runs and tests, alike across processes
    for _ in range(64):
        port = rng.choice(LISTEN_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: set in the processes of a worker group's ranks > 0: their rank 0 hosts the rendezvous store (host_rendezvous)
HOSTED_RENDEZVOUS_ENV = "VERLX_HOSTED_RENDEZVOUS"
_hosted_store = None


def host_rendezvous() -> int:
    """Rank 0 of a worker group: listen for the group's rendezvous now, on a port the OS gives, and return it. (A port
    found free and bound only when the model is loaded can be taken in between on a busy host: EADDRINUSE.)"""
    global _hosted_store
    _hosted_store = dist.TCPStore("0.0.0.0", 0, is_master=True, wait_for_workers=False)
    return _hosted_store.port


def init_distributed(timeout_s: float = 600.0) -> None:
    """Initialise the default process group once: NCCL for CUDA tensors plus gloo for CPU ones, gloo alone on CPU."""
    if dist.is_initialized():
        return
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise RuntimeError(f"cannot initialise torch.distributed: environment lacks {missing}")
    backend = "cpu:gloo,cuda:nccl" if torch.cuda.is_available() else "gloo"
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = datetime.timedelta(seconds=timeout_s)
    dist.init_process_group(backend=backend, rank=rank, world_size=world_size, timeout=timeout,
                            store=_rendezvous_store(rank, world_size, timeout))


def _rendezvous_store(rank: int, world_size: int, timeout: datetime.timedelta):
    """The store rank 0 hosts (host_rendezvous) and the other ranks' connections to it; None: torch's env://
    rendezvous on MASTER_ADDR:MASTER_PORT (torchrun, whose agent hosts the store)."""
    if rank == 0 and _hosted_store is not None:
        _hosted_store.set_timeout(timeout)
        return _hosted_store
    if rank > 0 and os.environ.get(HOSTED_RENDEZVOUS_ENV) == "1":
        return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                             is_master=False, timeout=timeout)
    return None
