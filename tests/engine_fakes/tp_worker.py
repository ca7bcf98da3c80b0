"""One worker process of the tensor-parallel engine tests: real gloo groups, the fake sglang or vllm package."""

from __future__ import annotations

import os
import pickle

import torch.distributed as dist

from engine_fakes.contexts import left_padded_prompts, make_ctx, trainer_weights
from engine_fakes.fake_sglang import install_fake_sglang
from engine_fakes.fake_vllm import install_fake_vllm


def run_rank(rank: int, world: int, port: int, root: str, version: str = "0.5.23") -> None:
    from verlx.rollout.sglang_engine import SGLangRolloutEngine
    from verlx.rollout.weight_sync import WeightSyncError

    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # Ray gives each actor its own GPU
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    state = install_fake_sglang(version, os.path.join(root, f"dist{rank}"))
    engine = SGLangRolloutEngine(make_ctx(os.path.join(root, f"model{rank}"), rank=rank, world_size=world,
                                          tp_size=2, n_gpus_per_node=world))
    # every rank holds its own full copy; rank r's is offset by 16 * r (exact in bf16) to tell the handles apart
    engine.update_weights([(n, t + 16 * rank) for n, t in trainer_weights()])
    out = engine.generate(left_padded_prompts({"n": 2}))
    engine.sleep()
    engine.wake_up()
    if rank % 2 == 0:
        state.fail_names["model.norm.weight"] = "norm has the wrong shape"
    try:
        engine.update_weights(trainer_weights())
        error = None
    except WeightSyncError as e:
        error = (e.engine, e.names, e.engine_message)
    received = [[(n, [v.tolist() for v in values]) for n, values in push] for e in state.engines for push in e.received]
    record = dict(
        calls=[c[:2] if c[0] == "Engine" else c[:1] for c in state.calls],
        engine_env=[c[2] for c in state.calls if c[0] == "Engine"],
        received=received,
        batch={k: v.tolist() for k, v in out.batch.items()},
        error=error,
    )
    with open(os.path.join(root, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(record, f)
    dist.destroy_process_group()


def start_fails_on_leader(rank: int, world: int, port: int, root: str) -> None:
    from verlx.rollout.sglang_engine import SGLangRolloutEngine

    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    state = install_fake_sglang("0.5.23", os.path.join(root, f"dist{rank}"))
    state.start_error = "Rank 0 scheduler died during initialization (exit code: -9)"
    try:
        SGLangRolloutEngine(make_ctx(os.path.join(root, f"model{rank}"), rank=rank, world_size=world, tp_size=2))
        message = None
    except RuntimeError as e:
        message = str(e)
    with open(os.path.join(root, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(message, f)
    dist.destroy_process_group()


def run_vllm_server_rank(rank: int, world: int, port: int, server_port: int, root: str) -> None:
    """One rank of a tensor-parallel group of 2 in vLLM server mode (the stand-in's server, importable through the
    environment the parent set)."""
    import json
    import urllib.request

    from verlx.config.roles import RolloutServerConfig
    from verlx.rollout.vllm_engine import VLLMRolloutEngine

    os.environ["CUDA_VISIBLE_DEVICES"] = str(rank)  # Ray gives each actor its own GPU
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    state = install_fake_vllm("0.26.0", os.path.join(root, f"dist{rank}"))
    ctx = make_ctx(os.path.join(root, f"model{rank}"), rank=rank, world_size=world, tp_size=2, n_gpus_per_node=world,
                   load_format="auto")
    ctx.config.server = RolloutServerConfig(enable=True, port=server_port, startup_timeout_s=60)
    engine = VLLMRolloutEngine(ctx)
    url = engine.server_url
    engine.sleep()
    engine.wake_up()
    engine.update_weights(trainer_weights())
    out = engine.generate(left_padded_prompts({"n": 2}))
    calls = None
    if url is not None:
        with urllib.request.urlopen(f"{url}/fake_calls", timeout=10) as response:
            calls = json.loads(response.read())
    engine.shutdown()
    record = dict(url=url, calls=calls, local_calls=[c[0] for c in state.calls],
                  batch={k: v.tolist() for k, v in out.batch.items()})
    with open(os.path.join(root, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(record, f)
    dist.destroy_process_group()
