"""A simulated 2-node cluster (two raylets on this machine): one group spans both nodes."""

from __future__ import annotations

import pytest

from runtime_workers import EchoGroup, EchoWorker
from verlx.single_controller.ray import RayClassWithInitArgs, RayResourcePool


def test_group_spans_two_nodes_and_all_reduce_works(two_node_cluster):
    pool = RayResourcePool([2, 2], use_gpu=False, name_prefix="twonode")
    group = EchoGroup(pool, RayClassWithInitArgs(EchoWorker), name="twonode")
    nodes = [ident.node_id for ident in group.identities]
    assert nodes[0] == nodes[1] and nodes[2] == nodes[3]  # a node's bundles stay together
    assert nodes[0] != nodes[2]  # the two halves landed on different raylets
    info = group.whoami("")
    assert [o["local_rank"] for o in info] == [0, 1, 0, 1]
    # sum over r of 1*(r+1) = 1+2+3+4
    assert group.all_reduce(1.0) == [10.0] * 4
    group.shutdown()
    pool.release()


def test_impossible_placement_fails_with_the_numbers(two_node_cluster):
    pool = RayResourcePool([3], use_gpu=False, name_prefix="toobig", placement_timeout_s=3)
    with pytest.raises(RuntimeError, match=r"could not place \[3\] processes"):
        pool.placement_groups()


def test_two_runs_on_one_cluster_get_their_own_placement_groups(two_node_cluster):
    """Named placement groups are unique per cluster: a second run with the same prefix (or after a failed run whose
    groups live on until its driver exits) must still place its workers."""
    first, second = (RayResourcePool([1], use_gpu=False, name_prefix="verlx") for _ in range(2))
    assert len(first.placement_groups()) == len(second.placement_groups()) == 1
    first.release()
    second.release()
