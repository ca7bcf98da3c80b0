"""Running verlx's `python -m ...` commands in a subprocess, as a user does."""

from __future__ import annotations

import os
import subprocess
import sys

REPO_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_module(args, module="verlx.trainer.main_ppo", cwd=None, env=None, timeout=300):
    full_env = {**os.environ, "PYTHONPATH": REPO_DIR, **(env or {})}
    return subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=cwd,
                          env=full_env, timeout=timeout)


def assert_no_traceback(result):
    assert "Traceback" not in result.stdout + result.stderr, result.stderr


def printed_job_config(result) -> str:
    """What `--cfg job` printed, after checking that it exited cleanly."""
    assert result.returncode == 0, result.stderr
    assert_no_traceback(result)
    return result.stdout
