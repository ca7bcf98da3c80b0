"""Engine placement over the worker mesh for 1–16 GPUs on 1–2 nodes: groups, leaders, GPUs and ports."""

from __future__ import annotations

import itertools

import pytest

from verlx.rollout.engine_layout import PORTS_PER_ENGINE, engine_visible_devices, plan_engine_layout


def valid_meshes():
    for nnodes, per_node in itertools.product((1, 2), range(1, 9)):
        world = nnodes * per_node
        for tp in range(1, world + 1):
            if world % tp:
                continue
            if (tp <= per_node and per_node % tp == 0) or (tp > per_node and tp % per_node == 0):
                yield nnodes, per_node, tp


MESHES = list(valid_meshes())


def test_every_mesh_size_is_covered():
    assert {n * g for n, g, _ in MESHES} == set(range(1, 9)) | {2 * g for g in range(1, 9)}
    # one node of g GPUs: the divisors of g (1,2,2,3,2,4,2,4 for g = 1..8: 20 sizes);
    # two nodes: the same divisors plus tp = 2g spanning both (28); 48 in all
    assert len(MESHES) == 48


@pytest.mark.parametrize("nnodes,per_node,tp", MESHES)
def test_layout_invariants(nnodes, per_node, tp):
    world = nnodes * per_node
    layouts = [plan_engine_layout(r, world, tp, per_node, nnodes) for r in range(world)]
    groups = {}
    for lay in layouts:
        groups.setdefault(lay.group_ranks, []).append(lay)
    assert len(groups) == world // tp
    gpus_taken = set()
    ports = {}
    for ranks, members in groups.items():
        assert list(ranks) == list(range(ranks[0], ranks[0] + tp))
        assert [m.rank for m in members if m.is_leader] == [ranks[0]]
        assert [m.tp_rank for m in members] == list(range(tp))
        assert len({m.dp_rank for m in members}) == 1
        launchers = [m for m in members if m.launches_engine]
        nodes = sorted({r // per_node for r in ranks})
        assert [m.node_rank for m in launchers] == nodes
        for launcher in launchers:
            assert launcher.engine_nnodes == len(nodes) == (tp // per_node if tp > per_node else 1)
            assert launcher.engine_node_rank == nodes.index(launcher.node_rank)
            # scheduler i of this node's engine lands on GPU base + i * step: exactly the peers' own GPUs
            gpus = [launcher.base_gpu_id + i * launcher.gpu_id_step for i in range(len(launcher.node_peer_ranks))]
            assert gpus == [r % per_node for r in launcher.node_peer_ranks]
            for g in gpus:
                assert (launcher.node_rank, g) not in gpus_taken
                gpus_taken.add((launcher.node_rank, g))
        triples = {(m.port, m.nccl_port, m.dist_init_port) for m in members}
        assert len(triples) == 1
        ports[ranks] = triples.pop()
    assert len(gpus_taken) == world
    used = [p for triple in ports.values() for p in triple]
    assert len(used) == len(set(used)), "two engines share a port"
    blocks = sorted(p for p, _, _ in ports.values())
    assert all(b - a >= PORTS_PER_ENGINE for a, b in zip(blocks, blocks[1:]))


def test_worked_examples():
    # 2 nodes × 8 GPUs, tp 4: rank 13 is tp rank 1 of group 12..15 (dp 3) on node 1, GPUs 4..7 of that node
    lay = plan_engine_layout(13, 16, 4, 8, 2)
    assert (lay.dp_rank, lay.tp_rank, lay.group_ranks, lay.leader_rank) == (3, 1, (12, 13, 14, 15), 12)
    assert (lay.launches_engine, lay.engine_nnodes, lay.base_gpu_id) == (False, 1, 4)
    assert (lay.port, lay.nccl_port, lay.dist_init_port) == (30048, 30049, 30050)  # 30000 + 3 * 16
    assert not lay.needs_dist_init_addr
    # tp 16 over both nodes: rank 8 starts node 1's engine (node_rank 1, GPUs 0..7); rank 0 leads the group
    lay = plan_engine_layout(8, 16, 16, 8, 2)
    assert (lay.launches_engine, lay.is_leader, lay.engine_nnodes, lay.engine_node_rank) == (True, False, 2, 1)
    assert (lay.base_gpu_id, lay.node_peer_ranks, lay.needs_dist_init_addr) == (0, tuple(range(8, 16)), True)


@pytest.mark.parametrize(
    "world,tp,per_node,nnodes,message",
    [
        (8, 3, 8, 1, r"tensor_model_parallel_size=3 must divide the world size 8.*\[1, 2, 4, 8\]"),
        (12, 4, 6, 2, r"does not divide trainer.n_gpus_per_node=6"),
        (24, 12, 8, 3, r"not a multiple of trainer.n_gpus_per_node=8"),
        (8, 0, 8, 1, r"tensor_model_parallel_size=0"),
        (8, 2, 4, 1, r"world size 8 != trainer.nnodes \(1\) × trainer.n_gpus_per_node \(4\)"),
    ],
)
def test_bad_meshes_name_the_key(world, tp, per_node, nnodes, message):
    with pytest.raises(ValueError, match=message):
        plan_engine_layout(0, world, tp, per_node, nnodes)


def test_ports_beyond_65535_are_refused():
    with pytest.raises(ValueError, match="VERLX_ROLLOUT_BASE_PORT"):
        plan_engine_layout(0, 16, 1, 8, 2, base_port=65400)


def test_visible_devices_narrowed_by_ray():
    lay = plan_engine_layout(4, 8, 4, 8, 1)  # group 4..7, launcher rank 4
    assert engine_visible_devices(lay, ["6", "7", "4", "5"]) == ("6,7,4,5", 0)
    assert engine_visible_devices(plan_engine_layout(3, 8, 1, 8, 1), ["3"]) == (None, 0)


def test_visible_devices_node_wide():
    lay = plan_engine_layout(4, 8, 4, 8, 1)
    assert engine_visible_devices(lay, [None] * 4) == (None, 4)
    everything = "0,1,2,3,4,5,6,7"
    assert engine_visible_devices(lay, [everything] * 4) == (None, 4)


def test_visible_devices_multi_node_uses_this_node_only():
    lay = plan_engine_layout(8, 16, 16, 8, 2)
    peers = [str(i) for i in range(8)] * 2
    assert engine_visible_devices(lay, peers) == ("0,1,2,3,4,5,6,7", 0)


def test_visible_devices_that_cannot_work():
    lay = plan_engine_layout(0, 8, 2, 8, 1)
    with pytest.raises(RuntimeError, match=r"CUDA_VISIBLE_DEVICES are \['3', '3'\]"):
        engine_visible_devices(lay, ["3", "3"])
    with pytest.raises(RuntimeError, match="one distinct GPU per process"):
        engine_visible_devices(lay, ["0,1", "2,3"])
