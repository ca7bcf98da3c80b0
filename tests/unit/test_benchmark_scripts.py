"""The GPU benchmark scripts run end to end on the CPU (their smoke modes), so GPU time is not spent on a crash."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, os.path.join(REPO, "benchmarks", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _run(cmd: list[str], out_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_offload_memory_smoke_runs_both_variants(tmp_path):
    proc = _run([sys.executable, "benchmarks/offload_memory.py", "--smoke"], tmp_path)
    with open(tmp_path / "offload_memory.json") as f:
        result = json.load(f)
    # tiny shape: tied embedding 512×64 = 32,768; per layer q 64×64+64, k and v 64×32+32 each, o 64×64,
    # MLP 3×64×128, 2 norms of 64 = 37,120; 2 layers + final norm 64 → 107,072
    n = 107_072
    assert result["variants"]["no_offload"]["parameters"] == n
    # fp32 actor (4 B) + Adam m, v (8 B) + fp32 reference (4 B) per parameter
    assert result["expected_drop_gib"]["resident_at_gen"] == n * 16 / 2**30
    assert result["expected_drop_gib"]["actor"] == n * 4 / 2**30
    assert result["measured_drop_gib"] == {}  # no CUDA memory statistics on the CPU
    for variant in ("no_offload", "offload"):
        (step,) = result["variants"][variant]["steps"]
        assert step["response_tokens"] == 2 * 2 * 4  # 2 prompts × n=2 × 4 tokens forced by ignore_eos
        assert math.isfinite(step["actor/pg_loss"]) and step["actor/grad_norm"] > 0
        assert step["phase_peak_gib"] == {} and step["resident_at_gen_gib"] is None
    assert "| peak: update |" in proc.stdout


def _variant(resident: float, peaks: dict) -> dict:
    step = {"resident_at_gen_gib": resident, "phase_peak_gib": peaks, "timing_s": dict.fromkeys(peaks, 1.0),
            "actor/pg_loss": 0.1, "actor/kl_loss": 0.0, "response_tokens": 8}
    return {"parameters": 2**26, "actor_param_bytes": 4, "ref_param_bytes": 4, "device": "gpu", "init_s": 1.0,
            "engine_weights_gib": 0.5, "kv_cache_gib": 10.0, "kv_slots": 4, "steps": [step]}


def test_offload_comparison_arithmetic_on_gpu_shaped_records(capsys):
    """The GPU-only half of the report, on records built from the arithmetic: 2^26 parameters, so the fp32 actor
    is 0.25 GiB, Adam 0.5 GiB, the fp32 reference 0.25 GiB (1.0 GiB resident without offload). Every peak is
    state + a rest that offload leaves alone: generate 0.5 engine + 10 KV + 1.0, old/ref log-probs 0.3, update
    0.25 gradients + 2.0."""
    script = _load_script("offload_memory")
    results = {"no_offload": _variant(1.0, {"gen": 12.5, "actor_infer": 1.3, "ref": 1.3, "actor": 3.25}),
               "offload": _variant(0.0, {"gen": 11.5, "actor_infer": 0.55, "ref": 0.55, "actor": 3.0})}
    out = script.compare(results)
    expected = {"resident_at_gen": 1.0, "gen": 1.0, "actor_infer": 0.75, "ref": 0.75, "actor": 0.25,
                "step_peak": 1.0}
    for key, value in expected.items():
        assert out["expected_drop_gib"][key] == pytest.approx(value)
        assert out["measured_drop_gib"][key] == pytest.approx(value)
    assert out["step_peak"]["no_offload"] == {"gib": 12.5, "phase": "gen"}
    assert out["step_peak"]["offload_expected"] == {"gib": pytest.approx(11.5), "phase": "gen"}
    rests = {"gen": 1.0, "actor_infer": 0.3, "ref": 0.3, "actor": 2.0}
    for variant in results:
        for phase, rest in rests.items():
            assert out["breakdown_gib"][variant][phase]["rest"] == pytest.approx(rest), (variant, phase)
    script.report(results, out)
    printed = capsys.readouterr().out
    assert "| step peak | 12.50 (generate) | 11.50 (generate) | 1.00 | 1.00 |" in printed


def test_parity_2gpu_cpu_mode_matches_one_rank_in_fp32(tmp_path):
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          "benchmarks/parity_2gpu.py", "--device", "cpu"], tmp_path)
    with open(tmp_path / "parity_2gpu.json") as f:
        result = json.load(f)
    assert result["ok"] and result["world_size"] == 2
    assert result["tolerance"] == {"loss_abs": 1e-5, "logprob_mean_abs": 1e-5, "logprob_max_abs": 1e-5,
                                   "grad_norm_rel": 1e-5}
    for run in ("fsdp2", "sp2"):
        check = result["checks"][run]
        assert check["ok"] and check["loss_abs"] <= 1e-5 and check["grad_norm_rel"] <= 1e-5, check
    assert result["results"]["sp2"]["ranks_agree"]
    assert result["results"]["1gpu"]["grad_norm"] > 0 and result["results"]["1gpu"]["pg_loss"] != 0


def test_rollout_throughput_drives_each_engine_in_its_own_process(tmp_path):
    """CPU smoke of the engine comparison: every engine forced to the full response length, its log-probs checked
    against transformers' forward pass, wake + push timed; an engine that cannot start is reported, not hidden."""
    script = os.path.join(REPO, "benchmarks", "rollout_throughput.py")
    small = ["--device", "cpu", "--shapes", "tiny", "--prompts", "2", "--prompt-len", "4", "--new-tokens", "4"]
    _run([sys.executable, script, *small, "--engines", "native,hf"], tmp_path)
    records = json.loads((tmp_path / "rollout_throughput.json").read_text())
    assert [r["engine"] for r in records] == ["native", "hf"]
    for r in records:
        assert r["warm_tok_s"] > 0 and r["wake_push_s"] >= 0
        assert r["logprob_gap"] < 0.01  # fp32 engine on the CPU against a bf16 forward pass

    failed = subprocess.run([sys.executable, script, *small, "--engines", "sglang"], cwd=REPO, capture_output=True,
                            text=True, timeout=180, env={**os.environ, "OUT": str(tmp_path)})
    assert failed.returncode == 1
    assert "sglang FAILED" in failed.stdout and "| tiny | sglang | failed |" in failed.stdout


def test_reward_overhead_runs_and_counts_the_hung_samples(tmp_path):
    proc = _run([sys.executable, "benchmarks/reward_overhead.py", "--samples", "64", "--repeats", "1",
                 "--hung", "2", "--timeout", "1"], tmp_path)
    with open(tmp_path / "reward_overhead.json") as f:
        result = json.load(f)
    assert result["samples"] == 64 and result["workers"] == 2
    assert result["hung"]["samples"] == 2 and result["hung"]["timeouts"] == 2
    assert result["pool_s"]["median"] > 0 and result["driver_s"]["median"] > 0
    assert "2 hung samples, reward.timeout_s=1" in proc.stdout


def test_agent_loop_gpu_smoke_runs_multi_turn_grpo_on_cpu(tmp_path):
    """The multi-turn benchmark's CPU mode: every sample makes its calculator calls (the benchmark loop calls for
    the random-weight model), turns and calls per step are logged, no trajectory disagrees with the template."""
    proc = _run([sys.executable, "benchmarks/agent_loop_gpu.py", "--device", "cpu", "--shape", "tiny", "--steps", "1",
                 "--prompts", "2", "--n", "2", "--tool-turns", "2", "--turn-tokens", "4"], tmp_path)
    with open(tmp_path / "agent_loop_metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 1
    row = rows[0]
    assert row["multi_turn/num_turns/mean"] == 3 and row["tool/calls/mean"] == 2
    assert row["tool/errors"] == 0 and row["multi_turn/template_mismatch"] == 0
    assert row["timing_s/gen"] > 0
    assert "| 1 | 3 | 2 |" in proc.stdout


def test_async_step_smoke_runs_sync_and_one_step_off_on_cpu(tmp_path):
    """The rollout-mode benchmark's CPU mode: sync on 2 colocated workers, one_step_off on 1 trainer + 1 rollout
    worker, both to the end, with the one_step_off run's staleness 1 after its first batch."""
    proc = _run([sys.executable, "benchmarks/async_step_gpu.py", "--smoke"], tmp_path)
    with open(tmp_path / "async_step.json") as f:
        result = json.load(f)
    assert set(result["modes"]) == {"sync", "one_step_off"}
    for mode in result["modes"].values():
        assert mode["rc"] == 0 and len(mode["steps"]) == 2
        assert all(step["response_length/mean"] == 4 for step in mode["steps"])  # ignore_eos: the same tokens
    assert [s["async/staleness/max"] for s in result["modes"]["one_step_off"]["steps"]] == [0.0, 1.0]
    assert [s["async/staleness/max"] for s in result["modes"]["sync"]["steps"]] == [0.0, 0.0]
    assert result["modes"]["one_step_off"]["steps"][1]["timing_s/weight_sync"] >= 0
    assert "| one_step_off |" in proc.stdout
