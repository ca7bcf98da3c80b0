"""The GPU benchmark scripts run end to end on the CPU (their smoke modes), so GPU time is not spent on a crash:
rollout throughput, reward overhead, the agent loop, host contention, multi-turn updates, the native decode profile."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import pytest

from helpers.benchmark_scripts import REPO, load_script, run_script


def test_rollout_throughput_drives_each_engine_in_its_own_process(tmp_path):
    """CPU smoke of the engine comparison: every engine forced to the full response length, its log-probs checked
    against transformers' forward pass, wake + push timed; an engine that cannot start is reported, not hidden."""
    script = os.path.join(REPO, "benchmarks", "rollout_throughput.py")
    small = ["--device", "cpu", "--shapes", "tiny", "--prompts", "2", "--prompt-len", "4", "--new-tokens", "4"]
    run_script([sys.executable, script, *small, "--engines", "native,hf"], tmp_path)
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
    proc = run_script([sys.executable, "benchmarks/reward_overhead.py", "--samples", "64", "--repeats", "1",
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
    proc = run_script([sys.executable, "benchmarks/agent_loop_gpu.py", "--device", "cpu", "--shape", "tiny",
                       "--steps", "1", "--prompts", "2", "--n", "2", "--tool-turns", "2", "--turn-tokens", "4"],
                      tmp_path)
    with open(tmp_path / "agent_loop_metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 1
    row = rows[0]
    assert row["multi_turn/num_turns/mean"] == 3 and row["tool/calls/mean"] == 2
    assert row["tool/errors"] == 0 and row["multi_turn/template_mismatch"] == 0
    assert row["timing_s/gen"] > 0
    assert "| 1 | 3 | 2 |" in proc.stdout
    # the workers size the micro-batches by token budget, as in the single-turn benchmark it is compared with
    (decisions,) = [line for line in proc.stdout.splitlines() if line.startswith("auto: ")]
    assert "actor_rollout_ref.actor.use_dynamic_bsz auto → true" in decisions


def test_agent_loop_gpu_passes_micro_batch_sizes_only_when_asked():
    """Fixed micro-batch sizes (16 samples per update micro-batch) made the multi-turn update several micro-batches
    per token budget; by default the script leaves them to the workers, like grpo_step_gpu."""
    script = load_script("agent_loop_gpu")

    def overrides(mode: str) -> list[str]:
        args = argparse.Namespace(tool_turns=2, turn_tokens=64, prompts=64, n=8, gpus=1, engine="vllm", steps=3,
                                  device="cuda", micro_batches=mode, extra=["trainer.seed=3"])
        return script.agent_overrides(args, "/m", "/d", "/o", "/w")

    sized = [o for o in overrides("fixed") if "micro_batch_size" in o]
    assert sized == ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
                     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
                     "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32"]
    auto = overrides("auto")
    assert not [o for o in auto if "micro_batch_size" in o or "use_dynamic_bsz" in o]
    assert auto[-1] == "trainer.seed=3" and "data.max_response_length=336" in auto


def test_host_contention_smoke_times_steps_alone_and_beside_a_competing_job(tmp_path):
    """CPU: one main_ppo run of 4 steps; the competitor (a loader with a worker process and an MLP loop) trains
    from the end of step 2, so step 2 ran alone and step 4 beside it (step 3 counts only if it ended before the
    competitor's first iteration, or is left out)."""
    proc = run_script([sys.executable, "benchmarks/host_contention.py", "--device", "cpu", "--smoke"], tmp_path)
    result = json.loads((tmp_path / "host_contention.json").read_text())
    assert result["rc"] == 0 and result["competitor_started"]
    assert result["alone_steps"] in ([2], [2, 3]) and result["contended_steps"] == [4]
    step = result["phases"]["timing_s/step"]
    assert step["ratio"] == pytest.approx(step["contended_s"] / step["alone_s"]) and step["alone_s"] > 0
    assert result["step_ratio"] == step["ratio"]
    assert {"timing_s/gen", "timing_s/update_actor"} <= set(result["phases"])
    assert "step slow-down with the competing job:" in proc.stdout


def test_host_contention_counts_steps_by_when_they_started():
    """A step is contended when it started (the previous step's row appeared) after the competitor's first
    iteration, alone when it ended before it; warm-up steps and the step in between are left out."""
    script = load_script("host_contention")
    rows = [{"step": s, "timing_s/step": t} for s, t in ((1, 50.0), (2, 1.0), (3, 1.0), (4, 1.6), (5, 1.2))]
    seen = {1: 50.0, 2: 51.0, 3: 52.0, 4: 53.6, 5: 54.8}
    alone, contended = script.split_steps(rows, seen, ready_at=52.5, warmup=1)
    assert [r["step"] for r in alone] == [2, 3] and [r["step"] for r in contended] == [5]  # 4 started at 52.0
    summary = script.summarise(alone, contended)
    assert summary["step_ratio"] == pytest.approx(1.2)
    assert script.split_steps(rows, seen, ready_at=None, warmup=1)[1] == []  # the competitor never trained


def test_multi_turn_update_layouts_and_the_micro_batches_each_mode_makes():
    """The agent benchmark's batch: 195 prompt + 3 × 64 model + 2 × 24 tool tokens = 435 real tokens a sample, 192
    trained; at its GPU shape (512 samples, two mini-batches) fixed 16-sample micro-batches make 32 of ~7k tokens
    where a 32,768-token budget makes 8 (4 per mini-batch of 111,360 tokens)."""
    from verlx.workers.micro_batching import micro_batches

    script = load_script("multi_turn_update")
    multi = script.layout_batch("multi_turn", 512, vocab=100)
    assert multi.batch["input_ids"].shape == (512, 256 + 336)
    assert multi.batch["attention_mask"].sum(-1).tolist() == [435] * 512
    assert multi.batch["response_mask"].sum(-1).tolist() == [192] * 512
    row = multi.batch["response_mask"][0]
    assert row[:64].all() and not row[64:88].any() and row[88:152].all() and row[240:].sum() == 0
    single = script.layout_batch("single_turn", script.samples_for_tokens("single_turn", 512 * 435), vocab=100)
    assert int(single.batch["attention_mask"].sum()) == pytest.approx(512 * 435, rel=0.005)  # the same tokens

    def count(micro, dynamic):
        return sum(len(micro_batches(mini, micro, dynamic, 32768)[0]) for mini in multi.split(256))

    assert count(16, False) == 32 and count(None, True) == 8


def test_native_decode_profile_smoke_pushes_weights_and_profiles_one_generate_call(tmp_path):
    """CPU, tiny shape: the engine gets real weights before it generates (it refuses to generate on its random
    start-up weights), one call is profiled, the per-step decode time is printed and the trace written to $OUT."""
    proc = run_script([sys.executable, "benchmarks/profile_native_decode.py", "--device", "cpu", "--shape", "tiny",
                       "--prompts", "4", "--new-tokens", "4"], tmp_path)
    assert re.search(r"decode backend \w+, sampler \w+: decode [\d.]+s over 3 steps \([\d.]+ ms/step\)", proc.stdout)
    assert (tmp_path / "native_decode_trace.json").stat().st_size > 0
