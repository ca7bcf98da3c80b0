"""vLLM on a GPU (skipped where vllm is not installed): generate → sleep → push → wake → generate."""

from __future__ import annotations

import socket

import pytest

from engine_fakes.constant_model import run_cycle

pytestmark = pytest.mark.gpu


def test_weights_pushed_while_asleep_take_effect(tmp_path, monkeypatch):
    pytest.importorskip("vllm", reason="vllm not installed")
    import torch.distributed as dist

    from verlx.rollout.vllm_engine import VLLMRolloutEngine
    from verlx.utils.distributed import init_distributed

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    init_distributed()
    try:
        # one sleep-mode LLM per process, so sleep level 2 (weights discarded, full push required) is the case run
        run_cycle(VLLMRolloutEngine, tmp_path, {"sleep_level": 2})
    finally:
        dist.destroy_process_group()
