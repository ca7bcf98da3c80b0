"""The GPU benchmark scripts run end to end on the CPU (their smoke modes), so GPU time is not spent on a crash:
GRPO and async steps, veRL side by side, the reward model, scaling."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys

import pytest

from helpers.benchmark_scripts import REPO, load_script, run_script


def test_async_step_smoke_runs_one_step_off_on_cpu(tmp_path):
    """The rollout-mode benchmark's CPU mode: one_step_off on 1 trainer + 1 rollout worker to the end, its
    staleness 1 after the first batch (sync mode's run is grpo_step_gpu's, smoked beside it)."""
    proc = run_script([sys.executable, "benchmarks/async_step_gpu.py", "--smoke"], tmp_path)
    with open(tmp_path / "async_step.json") as f:
        result = json.load(f)
    assert list(result["modes"]) == ["one_step_off"]
    steps = result["modes"]["one_step_off"]["steps"]
    assert result["modes"]["one_step_off"]["rc"] == 0 and len(steps) == 2
    assert all(step["response_length/mean"] == 4 for step in steps)  # ignore_eos: the same tokens
    assert [s["async/staleness/max"] for s in steps] == [0.0, 1.0]
    assert steps[1]["timing_s/weight_sync"] >= 0
    assert "| one_step_off |" in proc.stdout


def test_grpo_step_smoke_reports_the_automatic_choices_and_a_profile_of_step_2(tmp_path):
    proc = run_script([sys.executable, "benchmarks/grpo_step_gpu.py", "--smoke", "--profile", "actor"], tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "grpo_metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["response_length/mean"] == 8 for r in rows)
    decisions = json.loads((tmp_path / "grpo_decisions.json").read_text())["run"]
    assert decisions["actor_budget"] == decisions["log_prob_budget"] == 16384  # the CPU constant
    assert "gradient checkpointing auto → off (CPU run)" in decisions["lines"][0]
    summary = json.loads((tmp_path / "profile" / "actor_call2_rank0_summary.json").read_text())
    assert summary["optimizer_steps"] == 2 and summary["micro_batches"] == 2  # 2 mini-batches of 2 prompts × 2
    assert "| actor (2, 0) |" in proc.stdout


def test_grpo_step_reads_the_budget_from_a_gpu_log_line():
    script = load_script("grpo_step_gpu")
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
    script = load_script("peer_verl")
    rows = script.parse_verl_console(VERL_CONSOLE)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["actor/pg_loss"] == -0.0123 and rows[0]["timing_s/gen"] == 12.5 and rows[0]["actor/lr"] == 1e-6
    assert rows[0]["perf/flag"] == 1.0 and math.isnan(rows[0]["response/aborted_ratio"])
    assert rows[1] == {"step": 2, "timing_s/gen": 2.5, "timing_s/update_actor": 1.5, "timing_s/step": 5.0,
                       "response_length/mean": 256.0, "timing_s/old_log_prob": 0.5}


def test_peer_verl_side_by_side_uses_the_steady_steps(capsys):
    script = load_script("peer_verl")
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


def test_peer_verl_command_matches_the_verlxrun_script():
    script = load_script("peer_verl")
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


def test_peer_verl_smoke_lists_the_verl_attempts_with_the_fallback_budgets(tmp_path):
    """veRL's side of the CPU smoke with --skip-verlx (verlx's side is grpo_step_gpu.run_once, which
    test_grpo_step_smoke runs; the suite's time): every attempt is listed with its command, the token-budget
    attempts get the 16,384 fallback, and the side-by-side table has no verlx column values."""
    proc = run_script([sys.executable, "benchmarks/peer_verl.py", "--smoke", "--skip-verlx"], tmp_path)
    result = json.loads((tmp_path / "peer_verl.json").read_text())
    assert result["verlx"] == []
    assert result["budgets"] == {"actor_budget": 16384, "log_prob_budget": 16384}
    assert "veRL gets 16384" in proc.stdout
    assert [t["attempt"] for t in result["verl"]["tried"]] == ["v1-rmpad", "v0-rmpad", "v1-padded",
                                                               "v1-padded-fixed"]
    assert all("ppo_max_token_len_per_gpu=16384" in t["command"] for t in result["verl"]["tried"][:3])
    step = {row["metric"]: row for row in result["side_by_side"]}["timing_s/step"]
    assert step["verlx"] is None and step["verl"] is None
    assert "| generated tok/s |" in proc.stdout


def test_peer_verl_fixed_attempt_sizes_padded_micro_batches_by_tokens():
    """Padded rows of 64 + 1,024 tokens: 16,384 // 1,088 = 15 rows fit, so 8 (a power of two dividing the
    per-GPU mini-batch of 32 prompts × 4 = 128 samples); at 256 response tokens 16,384 // 320 = 51 → 32."""
    script = load_script("peer_verl")
    args = script.parse_args(["--prompts", "64", "--n", "4", "--response-length", "1024"])
    cmd = script.verl_command("/m", "/d", "/o", args, {"actor_budget": 24576, "log_prob_budget": 65536},
                              "v1-padded-fixed")
    overrides = dict(item.split("=", 1) for item in cmd[3:])
    assert overrides["actor_rollout_ref.actor.use_dynamic_bsz"] == "False"
    assert overrides["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"] == "8"
    assert overrides["actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"] == "8"
    assert overrides["actor_rollout_ref.model.use_remove_padding"] == "False"
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" not in overrides
    assert script.micro_batch(128, 320, 16384) == 32
    assert script.micro_batch(24, 320, 16384) == 8  # 16 does not divide 24
    assert script.micro_batch(128, 20000, 16384) == 1  # one row even where it exceeds the tokens


def test_peer_verl_all_attempts_keeps_the_fastest(tmp_path, monkeypatch):
    """--all-attempts runs every attempt and takes the one with the fewest steady seconds per step; without it
    the first to finish is taken."""
    script = load_script("peer_verl")
    seconds = {"v1-rmpad": 9.0, "v0-rmpad": None, "v1-padded": 4.0, "v1-padded-fixed": 6.0}

    def fake_run(cmd, cwd, env, timeout, stdout, stderr):
        attempt = os.path.basename(cwd)[len("verl-"):]
        if seconds[attempt] is not None:
            with open(env["VERL_FILE_LOGGER_PATH"], "w") as f:
                for step in (1, 2, 3):
                    f.write(json.dumps({"step": step, "data": {"timing_s/step": seconds[attempt] + step}}) + "\n")
        return argparse.Namespace(returncode=0 if seconds[attempt] else 1)

    monkeypatch.setattr(script.subprocess, "run", fake_run)
    budgets = {"actor_budget": 16384, "log_prob_budget": 16384}
    result = script.run_verl(script.parse_args(["--all-attempts"]), "/m", "/d", str(tmp_path), budgets)
    assert result["attempt"] == "v1-padded" and [r["timing_s/step"] for r in result["rows"]] == [5.0, 6.0, 7.0]
    assert [t.get("steps") for t in result["tried"]] == [3, 0, 3, 3]
    first = script.run_verl(script.parse_args([]), "/m", "/d", str(tmp_path / "first"), budgets)
    assert first["attempt"] == "v1-rmpad" and len(first["tried"]) == 1


def test_peer_trl_config_and_step_rows():
    """TRL's config mirrors the run (256 samples, two optimizer steps a step of 128, micro-batches of 8 rows of
    64 + 1,024 tokens: 16 accumulation steps) and a step spans two optimizer steps, its generation the generate
    calls that ended inside it."""
    script = load_script("peer_trl")
    args = script.parse_args(["--prompts", "64", "--n", "4", "--response-length", "1024", "--steps", "3"])
    config = script.trl_config(args, "vllm-colocate", "/o")
    assert config["generation_batch_size"] == 256 and config["num_generations"] == 4
    assert config["per_device_train_batch_size"] == 8 and config["gradient_accumulation_steps"] == 16
    assert config["max_steps"] == 6 and config["max_completion_length"] == 1024 and config["beta"] == 0.0
    assert config["use_vllm"] and config["vllm_gpu_memory_utilization"] == 0.4
    assert config["generation_kwargs"] == {"ignore_eos": True}
    assert script.trl_config(args, "hf-generate", "/o")["generation_kwargs"] == {"min_new_tokens": 1024}
    # optimizer steps end at 3, 4 | 9, 10 | 15, 16.5; generations end at 2.5 (1.5 s) and 8 (2 s) and 14 (2.5 s)
    rows = script.step_rows(1.0, [3.0, 4.0, 9.0, 10.0, 15.0, 16.5, 20.0], [(2.5, 1.5), (8.0, 2.0), (14.0, 2.5)],
                            [(2.6, 1024.0), (8.1, 1000.0)])
    assert rows == [{"step": 1, "timing_s/step": 3.0, "timing_s/gen": 1.5, "response_length/mean": 1024.0},
                    {"step": 2, "timing_s/step": 6.0, "timing_s/gen": 2.0, "response_length/mean": 1000.0},
                    {"step": 3, "timing_s/step": 6.5, "timing_s/gen": 2.5}]
    messages = [[{"role": "assistant", "content": "so #### 15"}], [{"role": "assistant", "content": "#### 14"}]]
    assert script.arithmetic_reward(messages, ["15", "15"]) == [1.0, 0.0]


def test_peer_trl_smoke_fails_loudly_without_trl_and_runs_with_it(tmp_path):
    """TRL is not a dependency of the suite: where it is missing the attempt's import error is kept and the
    script exits 1 (no table of nothing with exit 0); where it is installed its two steps are measured."""
    has_trl = importlib.util.find_spec("trl") is not None
    proc = run_script([sys.executable, "benchmarks/peer_trl.py", "--smoke", "--skip-verlx"], tmp_path,
                      returncode=0 if has_trl else 1)
    tried = json.loads((tmp_path / "peer_trl.json").read_text())["trl"]["tried"]
    assert [t["attempt"] for t in tried] == ["hf-generate"]
    if has_trl:
        assert [r["step"] for r in tried[0]["rows"]] == [1, 2] and tried[0]["rows"][1]["timing_s/step"] > 0
    else:
        assert tried[0]["rc"] == 1 and tried[0]["rows"] == []
        assert any("No module named" in line for line in tried[0]["log_tail"]), tried[0]["log_tail"]
        assert "TRL attempt hf-generate: rc 1, 0 steps" in proc.stdout


def test_peer_reward_scores_the_answer_after_the_last_marker():
    module = load_script("peer_reward")
    assert module.compute_score("arithmetic", "12+3 is #### 14, no: #### 15", "15") == 1.0
    assert module.compute_score("arithmetic", "#### 15 then #### 1,5", "15") == 1.0
    assert module.compute_score("arithmetic", "15", "15") == 0.0


def test_reward_model_smoke_scores_exactly_and_trains(tmp_path):
    run_script([sys.executable, "benchmarks/reward_model_gpu.py", "--smoke"], tmp_path)
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
