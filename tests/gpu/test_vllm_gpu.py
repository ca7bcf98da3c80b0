"""vLLM on a GPU (skipped where vllm is not installed): generate → sleep → push → wake → generate, per sleep level,
in-process and in server mode.

vLLM allows one sleep-mode LLM per process, so each in-process level runs in a fresh (spawned) process of its own;
in server mode the engine is the server's process anyway.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import socket

import pytest

pytestmark = pytest.mark.gpu


def _cycle_in_this_process(tmp_path: str, sleep_level: int) -> None:
    import torch.distributed as dist

    from engine_fakes.constant_model import run_cycle
    from verlx.rollout.vllm_engine import VLLMRolloutEngine
    from verlx.utils.distributed import init_distributed

    init_distributed()
    try:
        run_cycle(VLLMRolloutEngine, tmp_path, {"sleep_level": sleep_level})
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_weights_pushed_while_asleep_take_effect(tmp_path, sleep_level):
    pytest.importorskip("vllm", reason="vllm not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    process = mp.get_context("spawn").Process(target=_cycle_in_this_process, args=(tmp_path, sleep_level))
    process.start()
    process.join(timeout=600)
    assert process.exitcode == 0, f"the vLLM cycle at sleep level {sleep_level} failed (traceback above)"


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_server_mode_weights_pushed_while_asleep_take_effect(tmp_path, sleep_level):
    """rollout.server.enable: the same cycle against vLLM's own server, a process of its own on this GPU (weights
    as CUDA-IPC handles through /collective_rpc, generation through /inference/v1/generate)."""
    pytest.importorskip("vllm", reason="vllm not installed")
    from engine_fakes.constant_model import run_cycle
    from verlx.config.roles import RolloutServerConfig
    from verlx.rollout.vllm_engine import VLLMRolloutEngine

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = RolloutServerConfig(enable=True, port=port, startup_timeout_s=300)
    run_cycle(VLLMRolloutEngine, tmp_path, {"sleep_level": sleep_level, "server": server})
