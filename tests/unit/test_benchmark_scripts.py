"""The GPU benchmark scripts run end to end on the CPU (their smoke modes), so GPU time is not spent on a crash."""

from __future__ import annotations

import argparse
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


def _run(cmd: list[str], out_dir, returncode: int = 0) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == returncode, proc.stdout[-3000:] + proc.stderr[-3000:]
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


def test_megatron_parity_cpu_mode_matches_fsdp_at_tp2_and_pp2(tmp_path):
    """2 gloo processes, fp32: megatron TP=2 and PP=2 (the real pipeline schedule, the distributed optimizer,
    gradient clipping at 1 as on the GPU) give the FSDP actor's log-probs, loss, gradient norm and updated log-probs,
    and the exported TP=2 checkpoint (the distributed optimizer's fully_reshardable format) reloads to the same
    log-probs. This found three GPU-path faults: the TP head's gradient all-reduce lost (megatron reduced a
    contiguous copy of a transposed gradient), TP ranks' shards missing from the gradient norm (loaded weights were
    never marked tensor-parallel), and the export hanging when run on one rank of a process group."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    proc = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                 "benchmarks/megatron_parity.py", "--device", "cpu"], tmp_path)
    result = json.loads((tmp_path / "megatron_parity.json").read_text())
    assert result["ok"] and result["tolerance"]["grad_norm_rel"] == 1e-5
    assert set(result["checks"]) == {"pp2_logprob", "pp2_update", "tp2_logprob", "tp2_update", "export_reload"}
    assert all(check["ok"] for check in result["checks"].values()), result["checks"]
    assert result["update_shift"] > 100 * 1e-5  # the update moved the log-probs far beyond the tolerance
    fsdp = result["runs"]["fsdp"]
    for layout in ("pp2", "tp2"):
        assert result["runs"][layout]["grad_norm"] == pytest.approx(fsdp["grad_norm"], rel=1e-5)
    assert "| tp2_update | True |" in proc.stdout
    assert result["precision"] == "fp32" and result["noise_floor"] is None


def _megatron_parity_bf16(tmp_path, *extra: str, returncode: int = 0) -> dict:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
          "benchmarks/megatron_parity.py", "--device", "cpu", "--bf16", "--layouts", "tp2", *extra], tmp_path,
         returncode)
    return json.loads((tmp_path / "megatron_parity.json").read_text())


def test_megatron_parity_bf16_update_within_the_measured_noise_floor(tmp_path):
    """The GPU's bf16 check on the CPU: megatron TP=2 (bf16 weights, fp32 main params) after one Adam step is as far
    from the fp32 FSDP run as FSDP's own bf16 run is, within the floor's bound; before the update and in loss and
    gradient norm it is within the FSDP parity table's bf16 tolerances."""
    result = _megatron_parity_bf16(tmp_path)
    assert result["ok"] and result["precision"] == "bf16" and result["floor_multiple"] == 3
    assert set(result["checks"]) == {"noise_floor", "tp2_logprob", "tp2_update", "export_reload"}
    floor, update = result["noise_floor"], result["checks"]["tp2_update"]
    assert 0 < floor["after_mean"] < result["update_shift"] / 6  # bf16 rounds, and far less than the update moves
    # two correct bf16 runs: megatron's distance to fp32 is about FSDP's (ratio ~1 here), well inside 3 × rho × floor
    assert update["err_mean"] <= 2 * update["rho"] * floor["after_mean"], update
    assert update["err_max"] <= 2 * update["rho"] * floor["after_max"], update
    assert update["bound_mean"] == pytest.approx(3 * update["rho"] * floor["after_mean"])


@pytest.mark.parametrize("fault,caught_by", [
    ("half_lr_rank1", "update"),
    pytest.param("double_grads_rank1", "grad_norm", marks=pytest.mark.slow),
    pytest.param("drop_grads_rank1", "both", marks=pytest.mark.slow),
])
def test_megatron_parity_bf16_fails_on_a_planted_fault(tmp_path, fault, caught_by):
    """A fault on TP rank 1 fails the bf16 check (exit 1). Half the learning rate there leaves the loss, gradient
    norm and log-probs before the update alone and moves those after it ~3x past the floor's bound (the fixed
    tolerances, mean 1e-2 and max 0.15, would have passed it); doubled gradients change only the gradient norm (Adam's
    first step is scale-free); dropped gradients both."""
    result = _megatron_parity_bf16(tmp_path, "--plant-fault", fault, returncode=1)
    update = result["checks"]["tp2_update"]
    assert not result["ok"] and result["plant_fault"] == fault and not update["ok"]
    assert result["checks"]["tp2_logprob"]["ok"] and update["loss_abs"] <= 1e-2
    grad_norm_caught = update["grad_norm_rel"] > 2e-2
    update_caught = update["err_mean"] > update["bound_mean"]
    assert (grad_norm_caught, update_caught) == {"update": (False, True), "grad_norm": (True, False),
                                                 "both": (True, True)}[caught_by], update


@pytest.mark.slow
def test_megatron_gpu_smoke_runs_every_step_and_records_them(tmp_path):
    """The GPU script's pipeline on the CPU (fsdp and the hf engine stand in for megatron and SGLang in main_ppo):
    every main_ppo step passes and lands in the summary. Its parity step is megatron_parity.py, run on its own by
    test_megatron_parity_cpu_mode_matches_fsdp_at_tp2_and_pp2 (left out here: the suite's time)."""
    env = {**os.environ, "OUT": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "benchmarks/megatron_gpu.py", "--smoke", "--work", str(tmp_path / "w"),
                           "--only", "grpo", "export", "resume", "ppo_critic"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    steps = json.loads((tmp_path / "megatron_gpu.json").read_text())["steps"]
    assert list(steps) == ["grpo", "export", "resume", "ppo_critic"]
    assert all(step["ok"] for step in steps.values())
    assert [row["step"] for row in steps["grpo"]["rows"]] == [1, 2, 3]
    assert "resumed at step 3: True" in steps["resume"]["details"]
    assert all(row["critic/vf_loss"] > 0 for row in steps["ppo_critic"]["rows"])
    assert "| export | True |" in proc.stdout


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
    # the workers size the micro-batches by token budget, as in the single-turn benchmark it is compared with
    (decisions,) = [line for line in proc.stdout.splitlines() if line.startswith("auto: ")]
    assert "actor_rollout_ref.actor.use_dynamic_bsz auto → true" in decisions


def test_agent_loop_gpu_passes_micro_batch_sizes_only_when_asked():
    """Fixed micro-batch sizes (16 samples per update micro-batch) made the multi-turn update several micro-batches
    per token budget; by default the script leaves them to the workers, like grpo_step_gpu."""
    script = _load_script("agent_loop_gpu")

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
    proc = _run([sys.executable, "benchmarks/host_contention.py", "--device", "cpu", "--smoke"], tmp_path)
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
    script = _load_script("host_contention")
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

    script = _load_script("multi_turn_update")
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


def test_grpo_step_smoke_reports_the_automatic_choices_and_a_profile_of_step_2(tmp_path):
    proc = _run([sys.executable, "benchmarks/grpo_step_gpu.py", "--smoke", "--profile", "actor"], tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["response_length/mean"] == 8 for r in rows)
    decisions = json.loads((tmp_path / "grpo_decisions.json").read_text())["run"]
    assert decisions["actor_budget"] == decisions["log_prob_budget"] == 16384  # the CPU constant
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
    assert decisions["actor_budget"] == 65536 == decisions["log_prob_budget"] and len(decisions["lines"]) == 1
    assert script.auto_decisions("no choices here") == {"lines": [], "actor_budget": None, "log_prob_budget": None}


# Two veRL console lines as veRL 0.9.1's LocalLogger prints them (verl/utils/logger/aggregate_logger.py:
# "step:N" then " - key:pprint.pformat(value)" for every number; numpy 2 scalars print as np.float64(...)), behind
# the prefix Ray puts on the TaskRunner's output, with a log line in between.
VERL_CONSOLE = (
    "(TaskRunnerV1 pid=4242) step:1 - actor/pg_loss:np.float64(-0.0123) - timing_s/gen:12.5 - "
    "timing_s/update_actor:3.25 - timing_s/step:20.0 - response_length/mean:np.float64(256.0) - "
    "actor/lr:1e-06 - training/global_step:1 - response/aborted_ratio:np.float64(nan) - perf/flag:True\n"
    "(TaskRunnerV1 pid=4242) INFO: something else - with:colons\n"
    "(TaskRunnerV1 pid=4242) step:2 - timing_s/gen:2.5 - timing_s/update_actor:1.5 - timing_s/step:5.0 - "
    "response_length/mean:np.float64(256.0) - timing_s/old_log_prob:0.5\n"
)


def test_peer_verl_reads_verl_console_metric_lines():
    script = _load_script("peer_verl")
    rows = script.parse_verl_console(VERL_CONSOLE)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["actor/pg_loss"] == -0.0123 and rows[0]["timing_s/gen"] == 12.5 and rows[0]["actor/lr"] == 1e-6
    assert rows[0]["perf/flag"] == 1.0 and math.isnan(rows[0]["response/aborted_ratio"])
    assert rows[1] == {"step": 2, "timing_s/gen": 2.5, "timing_s/update_actor": 1.5, "timing_s/step": 5.0,
                       "response_length/mean": 256.0, "timing_s/old_log_prob": 0.5}


def test_peer_verl_side_by_side_uses_the_steady_steps(capsys):
    script = _load_script("peer_verl")
    verlx = [{"step": 1, "timing_s/step": 60.0, "response_length/mean": 256.0},
             {"step": 2, "timing_s/step": 2.0, "timing_s/gen": 0.5, "response_length/mean": 256.0},
             {"step": 3, "timing_s/step": 2.2, "timing_s/gen": 0.7, "response_length/mean": 256.0}]
    verl = script.parse_verl_console(VERL_CONSOLE)
    table = {row["metric"]: row for row in script.side_by_side(verlx, verl, samples_per_step=256)}
    assert table["timing_s/step"]["verlx"] == pytest.approx(2.1) and table["timing_s/step"]["verl"] == 5.0
    assert table["timing_s/step"]["verl / verlx"] == pytest.approx(5.0 / 2.1)
    # 256 samples × 256 tokens over the steady seconds per step
    assert table["generated tok/s"]["verlx"] == pytest.approx(256 * 256 / 2.1)
    assert table["generated tok/s"]["verl"] == pytest.approx(256 * 256 / 5.0)
    assert table["timing_s/ref"] == {"metric": "timing_s/ref", "verlx": None, "verl": None, "verl / verlx": None}
    script.print_side_by_side(list(table.values()))
    assert "| timing_s/step | 2.1 | 5 | 2.381 |" in capsys.readouterr().out


def test_peer_verl_command_matches_the_verlx_run():
    script = _load_script("peer_verl")
    args = script.parse_args(["--steps", "3"])
    cmd = script.verl_command("/m", "/d", "/o", args, {"actor_budget": 24576, "log_prob_budget": 65536}, "v0-rmpad")
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    overrides = dict(item.split("=", 1) for item in cmd[3:])
    assert overrides["data.train_batch_size"] == "64" and overrides["actor_rollout_ref.rollout.n"] == "4"
    assert overrides["data.max_response_length"] == "256"
    assert overrides["actor_rollout_ref.rollout.ignore_eos"] == "True"
    assert overrides["actor_rollout_ref.actor.ppo_mini_batch_size"] == "32"  # grpo_step_gpu's prompts // 2
    assert overrides["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "24576"
    assert overrides["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == "65536"
    assert overrides["actor_rollout_ref.actor.use_dynamic_bsz"] == "True"
    assert overrides["actor_rollout_ref.model.enable_gradient_checkpointing"] == "False"
    assert overrides["actor_rollout_ref.rollout.name"] == "vllm"
    assert overrides["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "1"
    assert overrides["actor_rollout_ref.actor.use_kl_loss"] == "False" and overrides["trainer.use_v1"] == "False"
    assert overrides["reward.custom_reward_function.path"].endswith("benchmarks/peer_reward.py")


def test_peer_verl_smoke_runs_the_verlx_side_and_lists_the_verl_attempts(tmp_path):
    proc = _run([sys.executable, "benchmarks/peer_verl.py", "--smoke"], tmp_path)
    result = json.loads((tmp_path / "peer_verl.json").read_text())
    assert [r["step"] for r in result["verlx"]] == [1, 2]
    assert result["budgets"] == {"actor_budget": 16384, "log_prob_budget": 16384}  # what verlx's workers chose
    assert [t["attempt"] for t in result["verl"]["tried"]] == ["v1-rmpad", "v0-rmpad", "v1-padded"]
    assert all("ppo_max_token_len_per_gpu=16384" in t["command"] for t in result["verl"]["tried"])
    step = {row["metric"]: row for row in result["side_by_side"]}["timing_s/step"]
    assert step["verlx"] > 0 and step["verl"] is None
    assert "| generated tok/s |" in proc.stdout


def test_peer_reward_scores_the_answer_after_the_last_marker():
    spec = importlib.util.spec_from_file_location("peer_reward", os.path.join(REPO, "benchmarks", "peer_reward.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.compute_score("arithmetic", "12+3 is #### 14, no: #### 15", "15") == 1.0
    assert module.compute_score("arithmetic", "#### 15 then #### 1,5", "15") == 1.0
    assert module.compute_score("arithmetic", "15", "15") == 0.0


def test_reward_model_smoke_scores_exactly_and_trains(tmp_path):
    _run([sys.executable, "benchmarks/reward_model_gpu.py", "--smoke"], tmp_path)
    with open(tmp_path / "reward_model_exactness.json") as f:
        check = json.load(f)
    # fp32 on the CPU: the FSDP-built reward model and the checkpoint's own forward agree to rounding
    assert check["sequences"] == 32 and check["max_abs_diff"] < 1e-5 < check["score_std"]
    with open(tmp_path / "reward_model_metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [r["step"] for r in rows] == [1, 2] and all(r["timing_s/reward"] > 0 for r in rows)
    assert os.path.exists(tmp_path / "reward_model_profile" / "reward_model_step2_rank0_summary.json")


def test_scaling_layouts_and_the_steady_step_summary():
    """scaling_gpu.py: a layout is GPUSxTP with TP dividing the GPUs; the table shows medians of steps ≥ 2."""
    sys.path.insert(0, os.path.join(REPO, "benchmarks"))
    import argparse

    import scaling_gpu

    assert scaling_gpu.parse_layout("4x2") == (4, 2)
    with pytest.raises(argparse.ArgumentTypeError, match="TP size 3 must divide the 4 GPUs"):
        scaling_gpu.parse_layout("4x3")
    rows = [{"step": s, "timing_s/step": t, "perf/throughput": 100.0 * s} for s, t in ((1, 60.0), (2, 5.0),
                                                                                      (3, 7.0), (4, 6.0))]
    summary = scaling_gpu.summarize(rows)
    assert summary["step s"] == 6.0 and summary["tokens/s/GPU"] == 300.0  # step 1 (compiling) left out
    assert summary["awake GB (max)"] is None  # not reported (CPU)
    assert scaling_gpu.summarize(rows[:1])["step s"] == 60.0
