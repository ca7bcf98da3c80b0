"""Running the benchmark scripts from tests: their smoke modes on the CPU, as a subprocess or loaded as a module."""

from __future__ import annotations

import importlib.util
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def load_script(name: str):
    """benchmarks/<name>.py as a module (its functions tested directly)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(cmd: list[str], out_dir, returncode: int = 0) -> subprocess.CompletedProcess:
    """`cmd` from the repository root with $OUT set, checked for `returncode` (its output shown when not)."""
    env = {**os.environ, "OUT": str(out_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == returncode, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc
