"""benchmarks/verl_crosscheck.py: verlx's algorithms against veRL 0.9.1's functions on random inputs. It needs the
unpacked veRL wheel (VERL_PATH, default /tmp/verl091) and veRL's pure-Python dependencies (VERL_DEPS, default
/tmp/verl_deps); without them the comparison is skipped, and the script itself refuses with exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VERL = os.environ.get("VERL_PATH", "/tmp/verl091")
DEPS = os.environ.get("VERL_DEPS", "/tmp/verl_deps")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": REPO, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "benchmarks/verl_crosscheck.py", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600, check=False)


def test_without_verl_the_script_refuses_naming_what_is_missing(tmp_path):
    proc = _run("--verl", str(tmp_path), "--deps", str(tmp_path))
    assert proc.returncode == 2 and "cannot import veRL" in proc.stderr and "--verl" in proc.stderr


@pytest.mark.skipif(not os.path.isdir(os.path.join(VERL, "verl")), reason=f"veRL 0.9.1 is not unpacked at {VERL}")
def test_every_shared_function_agrees_with_verl():
    proc = _run("--verl", VERL, "--deps", DEPS, "--seeds", "2")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = proc.stdout.strip().splitlines()[-1]
    assert " 0 above 1e-05" in summary, summary
    for case in ("adv tir_optimal_token_baseline + IS weights: advantages", "loss geo_mean token-mean: gradient",
                 "bypass_mode reinforce: value", "kl low_var_kl+: gradient", "agg_loss token-sum (dp 4, global counts)",
                 "rollout_corr/log_ppl_diff"):
        assert case in proc.stdout, case
