"""The triton decode backend (fused RoPE + cache write, length-aware attention with key splits, SwiGLU) against
the torch backend, on CPU through the Triton interpreter (a subprocess: TRITON_INTERPRET must be set before
triton compiles anything). On a GPU, test_native_engine_gpu.py runs the compiled kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_triton_backend_matches_torch_backend_in_the_interpreter():
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([TESTS_DIR, os.path.dirname(TESTS_DIR), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, os.path.join(TESTS_DIR, "native_triton_check.py")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stdout + result.stderr
