"""Placement groups: one per node, one bundle per GPU (or per CPU slot in CPU mode)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group


@dataclass
class BundleSlot:
    placement_group: PlacementGroup
    bundle_index: int
    node_index: int  # which entry of process_on_nodes


class RayResourcePool:
    """`process_on_nodes[i]` processes on node i. Each node's bundles are packed onto one node (STRICT_PACK),
    so LOCAL_RANK and intra-node communication mean what they say."""

    def __init__(
        self,
        process_on_nodes: list[int],
        use_gpu: bool = True,
        max_colocate_count: int = 1,
        cpus_per_bundle: float = 1,
        name_prefix: str = "verlx",
        placement_timeout_s: float = 120.0,
    ):
        if not process_on_nodes or any(int(n) <= 0 for n in process_on_nodes):
            raise ValueError(f"process_on_nodes must list a positive process count per node, got {process_on_nodes}")
        self.process_on_nodes = [int(n) for n in process_on_nodes]
        self.use_gpu = use_gpu
        self.max_colocate_count = max_colocate_count
        self.cpus_per_bundle = cpus_per_bundle
        self.name_prefix = name_prefix
        # named placement groups are unique per cluster: two runs on one cluster (or a failed run's groups, which
        # live until its driver exits) must not collide
        self._token = uuid.uuid4().hex[:8]
        self.placement_timeout_s = placement_timeout_s
        self._pgs: list[PlacementGroup] | None = None

    @property
    def world_size(self) -> int:
        return sum(self.process_on_nodes)

    def bundle(self) -> dict[str, float]:
        b = {"CPU": self.cpus_per_bundle}
        if self.use_gpu:
            b["GPU"] = 1
        return b

    def actor_resources(self) -> dict[str, float]:
        """What one actor asks of its bundle; colocated groups split it evenly."""
        share = 1.0 / self.max_colocate_count
        return {"num_cpus": self.cpus_per_bundle * share, "num_gpus": share if self.use_gpu else 0}

    def placement_groups(self) -> list[PlacementGroup]:
        if self._pgs is None:
            pgs = [placement_group([self.bundle()] * n, strategy="STRICT_PACK",
                                   name=f"{self.name_prefix}_{self._token}_node{i}")
                   for i, n in enumerate(self.process_on_nodes)]
            try:
                ray.get([pg.ready() for pg in pgs], timeout=self.placement_timeout_s)
            except ray.exceptions.GetTimeoutError:
                for pg in pgs:
                    remove_placement_group(pg)
                raise RuntimeError(
                    f"Ray could not place {self.process_on_nodes} processes with {self.bundle()} each within "
                    f"{self.placement_timeout_s:.0f}s; cluster resources: {ray.cluster_resources()}. "
                    "Lower trainer.n_gpus_per_node / trainer.nnodes or add nodes."
                ) from None
            self._pgs = pgs
        return self._pgs

    def slots(self) -> list[BundleSlot]:
        """Bundles in rank order: node 0's bundles first."""
        pgs = self.placement_groups()
        return [
            BundleSlot(pg, b, node_index)
            for node_index, (pg, n) in enumerate(zip(pgs, self.process_on_nodes))
            for b in range(n)
        ]

    def release(self) -> None:
        for pg in self._pgs or []:
            remove_placement_group(pg)
        self._pgs = None
