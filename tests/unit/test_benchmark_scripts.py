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
    assert result["variants"]["offload"]["offloaded_gib"] == 0  # the CPU ignores offload: nothing moves
    assert result["time_s"]["step"]["ratio"] > 0 and "| step (these phases) |" in proc.stdout


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


def test_offload_time_ratio_per_phase_and_for_the_step(capsys):
    script = _load_script("offload_memory")
    results = {"no_offload": _variant(1.0, {}), "offload": _variant(0.0, {})}
    results["no_offload"]["steps"][0]["timing_s"] = {"gen": 1.0, "actor_infer": 0.5, "ref": 0.5, "actor": 3.5}
    results["offload"]["steps"][0]["timing_s"] = {"gen": 1.2, "actor_infer": 0.6, "ref": 0.7, "actor": 4.5}
    results["offload"]["offloaded_gib"] = 23.0
    times = script.time_comparison(results)
    assert times["actor"] == {"no_offload": 3.5, "offload": 4.5, "ratio": pytest.approx(4.5 / 3.5)}
    assert times["step"]["no_offload"] == 5.5 and times["step"]["offload"] == pytest.approx(7.0)
    script.report_times(results)
    printed = capsys.readouterr().out
    assert "| update | 3.50 | 4.50 | 1.29× |" in printed
    assert "the offloaded step is 1.27× the resident one (within the 1.5× target)" in printed


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


def test_grpo_step_smoke_reports_the_automatic_choices_and_a_profile_of_step_2(tmp_path):
    proc = _run([sys.executable, "benchmarks/grpo_step_gpu.py", "--smoke", "--profile", "actor"], tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["response_length/mean"] == 8 for r in rows)
    decisions = json.loads((tmp_path / "grpo_decisions.json").read_text())["run"]
    assert decisions["actor_budget"] == 16384  # the CPU constant
    assert "gradient checkpointing auto → off (CPU run)" in decisions["lines"][0]
    summary = json.loads((tmp_path / "profile" / "actor_call2_rank0_summary.json").read_text())
    assert summary["optimizer_steps"] == 2 and summary["micro_batches"] == 2  # 2 mini-batches of 2 prompts × 2
    assert "| actor (2, 0) |" in proc.stdout


def test_grpo_step_reads_the_budget_from_a_gpu_log_line():
    script = _load_script("grpo_step_gpu")
    text = ("(WorkerDict pid=1) noise\n[2026-11-30][verlx.trainer.ppo_trainer][INFO] - actor: "
            "actor_rollout_ref.actor.use_dynamic_bsz auto → true (no micro-batch size set); "
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu auto → 65536 (usable 61.2 GiB = ...); "
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu auto → 65536 (resident 5.5 GiB)\n")
    decisions = script.auto_decisions(text)
    assert decisions["actor_budget"] == 65536 and len(decisions["lines"]) == 1
    assert script.auto_decisions("no choices here") == {"lines": [], "actor_budget": None}
