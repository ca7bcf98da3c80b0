"""Where each in-process engine runs: tensor-parallel groups carved from the worker mesh, GPUs and ports per rank.

The worker mesh has one process per GPU, ranks numbered node by node. A rollout tensor-parallel (TP) group is a
block of `tp_size` consecutive ranks (the layout vLLM's external launcher also assumes); each group is one engine
replica serving one data-parallel shard. SGLang starts one `Engine` per node of a group (its scheduler processes
sit on the group's GPUs of that node); the group's tp_rank 0 owns the tokenizer side and drives the engine.
Everything here is a pure function of the mesh shape so it can be checked for every size without GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

#: first port of the per-engine port blocks (override with VERLX_ROLLOUT_BASE_PORT)
DEFAULT_BASE_PORT = 30000
#: ports reserved per engine replica: port, nccl_port, dist_init_port and the ZMQ ports SGLang derives from it
PORTS_PER_ENGINE = 16
TP_KEY = "actor_rollout_ref.rollout.tensor_model_parallel_size"


@dataclass(frozen=True)
class EngineLayout:
    rank: int
    world_size: int
    tp_size: int
    n_gpus_per_node: int
    #: global ranks of this rank's TP group in tp-rank order
    group_ranks: tuple[int, ...]
    #: global ranks of the group that live on this rank's node, in tp-rank order
    node_peer_ranks: tuple[int, ...]
    #: this rank starts an engine for its node (first rank of the group on the node)
    launches_engine: bool
    #: how many nodes the group spans, and this node's index among them (SGLang nnodes / node_rank)
    engine_nnodes: int
    engine_node_rank: int
    #: local GPU index of the group's first GPU on this node, for a process that sees every GPU of its node
    base_gpu_id: int
    gpu_id_step: int
    port: int
    nccl_port: int
    #: port of the rendezvous SGLang needs when a group spans nodes (host: the leader's node)
    dist_init_port: int

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def dp_size(self) -> int:
        return self.world_size // self.tp_size

    @property
    def leader_rank(self) -> int:
        return self.group_ranks[0]

    @property
    def is_leader(self) -> bool:
        return self.rank == self.leader_rank

    @property
    def node_rank(self) -> int:
        return self.rank // self.n_gpus_per_node

    @property
    def needs_dist_init_addr(self) -> bool:
        return self.engine_nnodes > 1


def check_tp_size(world_size: int, tp_size: int, n_gpus_per_node: int) -> None:
    """Reject TP sizes that do not tile the mesh into whole groups that either fit in a node or span whole nodes."""
    if tp_size < 1 or world_size % tp_size != 0:
        divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
        raise ValueError(
            f"{TP_KEY}={tp_size} must divide the world size {world_size} (trainer.nnodes × trainer.n_gpus_per_node); "
            f"sizes that work: {divisors}"
        )
    if tp_size <= n_gpus_per_node:
        if n_gpus_per_node % tp_size != 0:
            raise ValueError(
                f"{TP_KEY}={tp_size} does not divide trainer.n_gpus_per_node={n_gpus_per_node}, so some "
                f"tensor-parallel groups would straddle two nodes; use a divisor of {n_gpus_per_node} or a multiple "
                f"of it"
            )
    elif tp_size % n_gpus_per_node != 0:
        raise ValueError(
            f"{TP_KEY}={tp_size} spans several nodes but is not a multiple of trainer.n_gpus_per_node="
            f"{n_gpus_per_node}; a multi-node engine needs the same number of GPUs on every node"
        )


def plan_engine_layout(
    rank: int,
    world_size: int,
    tp_size: int,
    n_gpus_per_node: int,
    nnodes: int,
    base_port: int = DEFAULT_BASE_PORT,
) -> EngineLayout:
    """The engine layout of one rank. Ports come in disjoint blocks per engine replica (data-parallel rank), so no two
    engines anywhere share a port, whatever node they land on."""
    if n_gpus_per_node < 1 or nnodes < 1 or world_size != n_gpus_per_node * nnodes:
        raise ValueError(
            f"world size {world_size} != trainer.nnodes ({nnodes}) × trainer.n_gpus_per_node ({n_gpus_per_node})"
        )
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside [0, {world_size})")
    check_tp_size(world_size, tp_size, n_gpus_per_node)
    dp_rank = rank // tp_size
    first = dp_rank * tp_size
    group = tuple(range(first, first + tp_size))
    node = rank // n_gpus_per_node
    nodes = sorted({r // n_gpus_per_node for r in group})
    peers = tuple(r for r in group if r // n_gpus_per_node == node)
    block = base_port + dp_rank * PORTS_PER_ENGINE
    last_port = base_port + (world_size // tp_size) * PORTS_PER_ENGINE - 1
    if base_port < 1024 or last_port > 65535:
        raise ValueError(
            f"engine ports {base_port}..{last_port} ({PORTS_PER_ENGINE} per engine × {world_size // tp_size} engines) "
            f"fall outside 1024..65535; set VERLX_ROLLOUT_BASE_PORT to a lower start"
        )
    return EngineLayout(
        rank=rank,
        world_size=world_size,
        tp_size=tp_size,
        n_gpus_per_node=n_gpus_per_node,
        group_ranks=group,
        node_peer_ranks=peers,
        launches_engine=rank == peers[0],
        engine_nnodes=len(nodes),
        engine_node_rank=nodes.index(node),
        base_gpu_id=peers[0] % n_gpus_per_node,
        gpu_id_step=1,
        port=block,
        nccl_port=block + 1,
        dist_init_port=block + 2,
    )


def engine_visible_devices(layout: EngineLayout, peer_visible: list[str | None]) -> tuple[str | None, int]:
    """(CUDA_VISIBLE_DEVICES for the engine's child processes or None to keep it, base_gpu_id).

    `peer_visible` holds each group rank's CUDA_VISIBLE_DEVICES (None when unset: every GPU) in tp-rank order.
    Ray narrows it to the actor's own GPU; then the launcher hands its children the node peers' GPUs in tp-rank
    order and counts from 0, so the scheduler of tp rank i sits on the GPU of trainer tp rank i (CUDA-IPC handles
    stay on one device). When every process sees the whole node, the planned base_gpu_id applies unchanged.
    """
    if len(peer_visible) != layout.tp_size:
        raise ValueError(f"expected {layout.tp_size} CUDA_VISIBLE_DEVICES entries, got {len(peer_visible)}")
    first = layout.group_ranks[0]
    mine = [peer_visible[r - first] for r in layout.node_peer_ranks]
    if all(v is None for v in mine):
        return None, layout.base_gpu_id
    lists = [[d.strip() for d in v.split(",") if d.strip()] if v is not None else None for v in mine]
    if all(d is not None and len(d) == 1 for d in lists) and len({d[0] for d in lists}) == len(lists):
        return (None if len(lists) == 1 else ",".join(d[0] for d in lists)), 0
    if len(set(mine)) == 1 and len(lists[0]) >= layout.n_gpus_per_node:
        return None, layout.base_gpu_id
    raise RuntimeError(
        f"cannot place the engine of ranks {list(layout.node_peer_ranks)}: their CUDA_VISIBLE_DEVICES are {mine}; "
        f"expected one distinct GPU per process (Ray's default) or every GPU of the node in each process"
    )
