"""Tensor-parallel SGLang rollout over real gloo process groups (4 ranks, tp 2) with the fake sglang package:
one engine per group on its leader, CUDA-IPC handles gathered in tp-rank order, results shared with the peer,
a rejected update raised on every rank."""

from __future__ import annotations

import os
import pickle

import pytest
import torch.multiprocessing as mp
from packaging.version import Version

from engine_fakes.contexts import SHAPES
from engine_fakes.tp_worker import run_rank, start_fails_on_leader
from verlx.utils.distributed import free_port


def _load(tmp_path, rank: int):
    with open(os.path.join(tmp_path, f"rank{rank}.pkl"), "rb") as f:
        return pickle.load(f)


@pytest.mark.parametrize("version", ["0.5.9", "0.5.17", "0.5.23"])
def test_two_groups_of_two(tmp_path, version):
    """0.5.9: LocalSerializedTensor in model_runner; 0.5.17 (the release run on the GPU machine): updates without
    a session, the class in model_runner_components.weight_updater; 0.5.23: every update inside
    begin/end_weight_update."""
    mp.spawn(run_rank, args=(4, free_port(), str(tmp_path), version), nprocs=4, join=True)
    records = [_load(tmp_path, r) for r in range(4)]
    for leader, peer in ((0, 1), (2, 3)):
        lead, other = records[leader], records[peer]
        assert other["calls"] == [] and other["received"] == []
        engine_call = lead["calls"][0]
        assert engine_call[0] == "Engine"
        kwargs = engine_call[1]
        placement = (kwargs["tp_size"], kwargs["base_gpu_id"], kwargs["nnodes"], kwargs["port"])
        assert placement == (2, 0, 1, 30000 + 8 * leader)  # port block 16 per replica, replica = leader // 2
        assert kwargs["random_seed"] == 5 + leader // 2
        assert lead["engine_env"][0]["CUDA_VISIBLE_DEVICES"] == f"{leader},{peer}"
        session = Version(version) >= Version("0.5.21")
        push = ["begin_weight_update", "update_weights_from_tensor", "end_weight_update"] if session else [
            "update_weights_from_tensor"]
        assert [c[0] for c in lead["calls"][1:]] == [
            *push, "flush_cache", "async_generate", "async_generate",  # the two prompts, n=2 each
            "release_memory_occupation", "resume_memory_occupation", "resume_memory_occupation", *push,
        ]
        # first push: for each tensor, the handle of tp rank 0 then tp rank 1 (values i + 1 + 16 * rank)
        first = dict(lead["received"][0])
        for i, name in enumerate(n.replace("_fsdp_wrapped_module.", "") for n in SHAPES):
            handles = first[name]
            assert len(handles) == 2
            assert _all(handles[0], i + 1 + 16 * leader) and _all(handles[1], i + 1 + 16 * peer)
        assert lead["batch"] == other["batch"]
        assert lead["batch"]["responses"][0][:3] == [118, 119, 2]
        for record in (lead, other):
            engine, names, message = record["error"]
            assert engine == "sglang" and "model.norm.weight" in names and message == "norm has the wrong shape"


def _all(nested, value) -> bool:
    if isinstance(nested, list):
        return all(_all(x, value) for x in nested)
    return nested == value


def test_a_failed_start_on_the_leader_raises_on_the_peer_too(tmp_path):
    mp.spawn(start_fails_on_leader, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    leader, peer = (_load(tmp_path, r) for r in range(2))
    assert leader == "Rank 0 scheduler died during initialization (exit code: -9)"
    assert peer == (
        "sglang engine start failed on a tensor-parallel peer: "
        "['rank 0: Rank 0 scheduler died during initialization (exit code: -9)']"
    )
