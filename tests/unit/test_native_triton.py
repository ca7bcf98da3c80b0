"""The triton kernels on CPU: the decode backend (fused RoPE + cache write, length-aware attention with key
splits, SwiGLU, RMSNorm) against the torch backend, and the fused sampler against the torch sampler, through
the Triton interpreter (subprocesses: TRITON_INTERPRET must be set before triton compiles anything); and every
kernel compiled for a Hopper GPU ahead of time, so a kernel the interpreter accepts but the compiler rejects
fails here, not as a silent fallback to torch on the GPU. test_native_engine_gpu.py runs the compiled kernels."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

TESTS_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("script", ["native_triton_check.py", "native_triton_sampling_check.py"])
def test_triton_kernels_match_torch_in_the_interpreter(script):
    env = dict(os.environ, TRITON_INTERPRET="1")
    env["PYTHONPATH"] = os.pathsep.join([TESTS_DIR, os.path.dirname(TESTS_DIR), env.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, os.path.join(TESTS_DIR, script)], env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0 and result.stdout.strip().endswith("OK"), result.stdout + result.stderr[-5000:]


def test_every_kernel_compiles_for_sm90():
    from native_triton_aot import compile_all

    if compile_all is None:
        pytest.skip("this triton has no bundled ptxas / CUDA backend to compile with")
    compiled = compile_all()
    assert len(compiled) >= 10, compiled
