"""The fixtures the fake-engine tests share: what a test installed is undone afterwards."""

from __future__ import annotations

import multiprocessing as mp

import pytest


@pytest.fixture
def undo(monkeypatch):
    """A list the test appends installed fakes to (each with .undo()); the multiprocessing start method and vLLM's
    multiprocessing switch are restored too."""
    states = []
    start_method = mp.get_start_method(allow_none=True)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    yield states
    for state in reversed(states):  # last in, first out: a second install saved the first as what to restore
        state.undo()
    mp.set_start_method(start_method, force=True)


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    """The stand-in SGLang 0.5.17 installed for one test; the environment variables SGLang's engine sets and the
    multiprocessing start method are restored afterwards."""
    from engine_fakes.fake_sglang import install_fake_sglang

    for key in ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"):
        monkeypatch.delenv(key, raising=False)
    start_method = mp.get_start_method(allow_none=True)
    state = install_fake_sglang("0.5.17", str(tmp_path / "dist"))
    yield state
    state.undo()
    mp.set_start_method(start_method, force=True)
