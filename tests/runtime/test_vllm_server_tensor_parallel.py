"""vLLM server mode with a tensor-parallel group of 2 over real gloo process groups and the stand-in's server: the
group's first rank starts one server on both GPUs with vLLM's multiprocess executor, drives it alone (sleep, wake,
the push gathered from both ranks into both of its workers, generation), and both ranks return the same batch."""

from __future__ import annotations

import os
import pickle

import torch.multiprocessing as mp

from engine_fakes.fake_vllm_server import write_importable_package
from engine_fakes.tp_worker import run_vllm_server_rank
from verlx.utils.distributed import free_port

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_one_group_of_two_drives_one_server(tmp_path, monkeypatch):
    site = write_importable_package(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([site, TESTS, os.path.dirname(TESTS),
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("FAKE_VLLM_VERSION", "0.26.0")
    monkeypatch.setenv("FAKE_VLLM_DIST", str(tmp_path / "server_dist"))
    mp.spawn(run_vllm_server_rank, args=(2, free_port(), free_port(), str(tmp_path)), nprocs=2, join=True)
    lead, peer = (pickle.loads((tmp_path / f"rank{r}.pkl").read_bytes()) for r in (0, 1))
    assert peer["url"] is None and peer["calls"] is None and lead["url"] is not None
    assert lead["local_calls"] == peer["local_calls"] == []  # nothing in-process: the server does it all
    (_, env), (_, llm_args, _) = lead["calls"][:2]
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"  # the group's GPUs, in tp-rank order
    assert (llm_args["tensor_parallel_size"], llm_args["distributed_executor_backend"]) == (2, "mp")
    rpc = [c for c in lead["calls"] if c[0] == "collective_rpc"]
    assert [c[1] for c in rpc] == ["verlx_model_info", "verlx_load_weights"]
    loaded = rpc[1][2]
    assert len(loaded) == 2 and loaded[0] == loaded[1] and "model.layers.0.self_attn.qkv_proj.weight" in loaded[0]
    assert [c[0] for c in lead["calls"] if c[0] in ("sleep", "wake_up", "abort_requests")] == ["sleep", "wake_up",
                                                                                                "wake_up"]
    assert sum(1 for c in lead["calls"] if c[0] == "add_request") == 4  # two prompts, n=2
    assert lead["batch"] == peer["batch"]
