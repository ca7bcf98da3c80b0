"""The GPU learning benchmark (benchmarks/learning_gpu.py, peer_verl.py --learning, learning_report.py) on the CPU:
its task, the GRPO command lines of every layout against verlx's config, the summaries' arithmetic, veRL's command
and log lines, the report and pictures, and the whole pipeline on a tiny model."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer.preflight import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCHMARKS = os.path.join(REPO, "benchmarks")


def _load(name: str):
    """A benchmark script as a module (they import each other by name from benchmarks/)."""
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    return importlib.import_module(name)


task = _load("learning_task")
learning = _load("learning_gpu")
report = _load("learning_report")


# -------------------------------------------------------------------------------------------------------- the task
def test_a_problem_its_question_answer_and_worked_solutions():
    problem = task.Problem("Ann", "pens", 23, (("buys", 15), ("loses", 8), ("gives away", 4)))
    assert problem.question() == "Ann has 23 pens. Ann buys 15, then loses 8, then gives away 4. How many pens does " \
                                 "Ann have?"
    assert problem.answer() == 26
    assert problem.solution() == "23+15=38\n38-8=30\n30-4=26\n#### 26"
    # the teacher's slip on the second operation: 38+8, and the rest follows from 46
    assert problem.solution((False, True, False)) == "23+15=38\n38+8=46\n46-4=42\n#### 42"
    row = task.to_row(problem, "train", 7, problem.solution((False, True, False)))
    assert row["reward_model"]["ground_truth"] == "26" and row["data_source"] == "arithmetic"
    assert not task.solution_is_correct(row)


LINE = re.compile(r"^(\d+)([+-])(\d+)=(\d+)$")


def _operations(row: dict) -> list[tuple[str, str]]:
    """(verb, sign written) per operation of a row's worked solution, its arithmetic checked line by line."""
    question = row["prompt"][0]["content"]
    verbs = re.findall(r"(buys|finds|wins|sells|loses|gives away) \d+", question)
    *lines, final = row["extra_info"]["answer"].split("\n")
    value = int(re.match(r"^\w+ has (\d+) ", question).group(1))
    signs = []
    for line in lines:
        a, sign, b, result = LINE.match(line).groups()
        assert int(a) == value and int(result) == (int(a) + int(b) if sign == "+" else int(a) - int(b))
        value = int(result)
        signs.append(sign)
    assert final == f"#### {value}" and len(verbs) == len(signs)
    return list(zip(verbs, signs))


def test_splits_are_disjoint_deterministic_and_only_the_teacher_slips():
    sizes = {"test": 40, "val": 20, "train": 300}
    splits = task.make_splits(sizes, seed=3, teacher_error=0.6)
    assert splits == task.make_splits(sizes, seed=3, teacher_error=0.6)
    assert {k: len(v) for k, v in splits.items()} == sizes
    questions = [r["prompt"][0]["content"] for rows in splits.values() for r in rows]
    assert len(set(questions)) == len(questions)
    slips = 0
    for split, rows in splits.items():
        for row in rows:
            ops = _operations(row)
            assert 2 <= len(ops) <= 4
            for verb, sign in ops:
                correct = "+" if verb in task.ADD_VERBS else "-"
                assert sign == correct or (split == "train" and verb in task.MISREAD), (split, row)
                slips += sign != correct
            if split != "train":
                assert task.solution_is_correct(row)
    assert slips > 0
    # teacher_error 1: a training solution is right exactly when its question has no MISREAD verb
    always = task.make_splits({"train": 200}, seed=3, teacher_error=1.0)["train"]
    for row in always:
        assert task.solution_is_correct(row) == (not any(v in task.MISREAD for v, _ in _operations(row)))
    clean = task.make_splits({"train": 200}, seed=3, teacher_error=0.0)["train"]
    assert all(map(task.solution_is_correct, clean))
    assert task.greedy_teacher_ceiling(always) == sum(map(task.solution_is_correct, always)) / 200


def test_bad_task_settings_are_refused():
    with pytest.raises(ValueError, match="teacher_error"):
        task.make_splits({"train": 1}, 0, 1.5)
    with pytest.raises(ValueError, match="min_ops"):
        task.make_splits({"train": 1}, 0, 0.5, min_ops=3, max_ops=2)


# ------------------------------------------------------------------------------------------------- command lines
def _args(*argv):
    return learning.parse_args(["--out", "/w", *argv])


INFO = {"max_prompt_tokens": 150, "max_solution_tokens": 50}


def _overrides(args) -> dict:
    p = learning.paths("/w")
    return dict(item.split("=", 1) for item in learning.grpo_overrides(args, p, INFO, "/w/runs/x"))


def _validated(overrides: dict) -> PPOConfig:
    """The overrides composed with verlx's ppo_trainer.yaml and checked (no files, no Ray; CPU workers stand for
    the GPUs)."""
    items = [f"{k}={v}" for k, v in overrides.items()] + ["trainer.device=cpu"]
    config = build(PPOConfig, to_container(load_yaml(overrides=items)))
    validate(config, check_files=False)
    return config


def test_grpo_overrides_of_the_default_run():
    overrides = _overrides(_args("--seed", "1"))
    assert overrides["data.train_batch_size"] == "64" and overrides["actor_rollout_ref.rollout.n"] == "8"
    assert overrides["actor_rollout_ref.actor.ppo_mini_batch_size"] == "32"  # two updates per step
    assert overrides["actor_rollout_ref.actor.optim.lr"] == "3e-05"
    assert overrides["data.max_prompt_length"] == "150" and overrides["data.max_response_length"] == "64"
    assert overrides["data.val_files"] == "/w/data/test.parquet"
    assert overrides["data.train_files"] == "/w/data/rl_train.parquet"
    assert overrides["actor_rollout_ref.model.path"] == "/w/sft_model"
    assert overrides["trainer.seed"] == overrides["actor_rollout_ref.rollout.seed"] == "1"
    assert overrides["trainer.test_freq"] == "5" and overrides["trainer.val_before_train"] == "true"
    assert overrides["custom_reward_function.path"].endswith("benchmarks/peer_reward.py")
    assert overrides["trainer.experiment_name"] == "verlx-native-1gpu-sync-s1"
    config = _validated(overrides)
    assert config.actor_rollout_ref.rollout.temperature == 1.0 and not config.actor_rollout_ref.actor.use_kl_loss
    assert config.actor_rollout_ref.rollout.val_kwargs.do_sample is False  # greedy held-out accuracy


def test_grpo_overrides_of_the_two_gpu_layouts_and_the_rollout_modes():
    tp = _overrides(_args("--engine", "sglang", "--gpus", "2", "--rollout-tp", "2"))
    assert tp["trainer.experiment_name"] == "verlx-sglang-dp2-tp2-sync-s0"
    assert tp["trainer.n_gpus_per_node"] == "2" and tp["actor_rollout_ref.rollout.tensor_model_parallel_size"] == "2"
    assert _validated(tp).actor_rollout_ref.rollout.name == "sglang"
    for mode in ("one_step_off", "async"):
        overrides = _overrides(_args("--mode", mode, "--gpus", "2"))
        assert overrides["trainer.experiment_name"] == f"verlx-native-1t1r-{mode}-s0"
        assert overrides["actor_rollout_ref.hybrid_engine"] == "false"
        assert overrides["trainer.n_gpus_per_node"] == overrides["rollout.n_gpus_per_node"] == "1"
        assert overrides["algorithm.rollout_correction.rollout_is"] == "token"
        config = _validated(overrides)
        assert config.trainer.rollout_mode == mode
        assert config.trainer.max_staleness == (2 if mode == "async" else None)
        assert config.data.train_batch_size * config.actor_rollout_ref.rollout.n == 512  # the same samples as sync


@pytest.mark.parametrize("argv,message", [
    (["--mode", "async"], "--mode async runs one trainer GPU and one rollout GPU"),
    (["--gpus", "1", "--rollout-tp", "2"], "--rollout-tp 2 must be 1 or --gpus (1)"),
    (["--prompts", "63"], "--prompts 63 must split into --updates-per-step 2"),
    (["--steps", "200"], "--rl-size 8192 must be within [--prompts × --steps = 12800, --train-size 40000]"),
])
def test_layouts_it_does_not_know_are_refused(argv, message, capsys):
    with pytest.raises(SystemExit):
        _args(*argv)
    assert message in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------------- summaries
KEY = "val-core/arithmetic/reward/mean@1"
TIMED_ROWS = [  # (row, seconds since the run started when its line appeared)
    ({"step": 0, KEY: 0.25}, 40.0),
    ({"step": 1, "timing_s/step": 4.0, "critic/score/mean": 0.4, "response_length/mean": 30.0}, 44.5),
    ({"step": 2, "timing_s/step": 3.0, KEY: 0.5, "timing_s/testing": 1.5, "critic/score/mean": 0.5}, 49.0),
    ({"step": 3, "timing_s/step": 2.0, KEY: "nan", "timing_s/testing": 1.0}, 52.0),
]


def test_summary_times_each_validation_without_the_validations():
    summary = learning.learning_summary(TIMED_ROWS, {"name": "r"}, val_size=512)
    # step 2: 49 − 40 − 1.5 (its own validation); step 3: 52 − 40 − 1.5 − 1.0
    assert summary["curve"][:2] == [{"step": 0, "accuracy": 0.25, "elapsed_s": 0.0},
                                    {"step": 2, "accuracy": 0.5, "elapsed_s": 7.5}]
    assert summary["curve"][2]["step"] == 3 and math.isnan(summary["curve"][2]["accuracy"])
    assert [s["elapsed_s"] for s in summary["steps"]] == [4.5, 7.5, 9.5]
    assert summary["steps"][0] == {"step": 1, "step_s": 4.0, "elapsed_s": 4.5, "score": 0.4, "response_length": 30.0}
    assert summary["mean_step_s"] == 2.5  # steps ≥ 2
    assert summary["train_s"] == 9.5 and summary["start_accuracy"] == 0.25
    assert summary["gain_resolution_95"] == pytest.approx(1.96 * math.sqrt(0.5 / 512))
    finished = learning.learning_summary(TIMED_ROWS[:3], {}, val_size=512)
    assert finished["end_accuracy"] == 0.5 and finished["gain"] == 0.25 and finished["best_accuracy"] == 0.5


def test_lines_read_in_one_poll_keep_the_training_time_from_going_back():
    """Steps 1 and 2 read in one poll (both stamped 44.5 s): step 2 less its 1.5 s validation would be 3.0 s, before
    step 1's 4.5 s; it stays at 4.5 s (a busy CI machine's delayed poll failed the smoke test's order check so)."""
    rows = [TIMED_ROWS[0], TIMED_ROWS[1], (TIMED_ROWS[2][0], 44.5), TIMED_ROWS[3]]
    summary = learning.learning_summary(rows, {}, val_size=512)
    assert [s["elapsed_s"] for s in summary["steps"]] == [4.5, 4.5, 9.5]
    assert [c["elapsed_s"] for c in summary["curve"]] == [0.0, 4.5, 9.5]


def test_a_run_that_logged_nothing_has_an_empty_summary():
    summary = learning.learning_summary([], {"name": "r"}, val_size=8)
    assert summary["curve"] == [] and summary["gain"] is None and summary["train_s"] is None


WRITER = """
import json, sys, time
with open(sys.argv[1], "a") as f:
    for step in range(2):
        f.write(json.dumps({"step": step, "timing_s/step": 1.0}) + "\\n")
        f.flush()
        time.sleep(0.6)
    f.write('{"step": 2, "partial')
    f.flush()
    time.sleep(60)
"""


def test_run_watched_times_each_metrics_line_and_ends_a_run_past_its_timeout(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    seen = []
    result = learning.run_watched([sys.executable, "-c", WRITER, str(metrics)], str(tmp_path), dict(os.environ),
                                  str(tmp_path / "run.log"), str(metrics), "w", timeout_s=3,
                                  on_rows=lambda rows: seen.append([row["step"] for row, _ in rows]))
    assert result["rc"] == -15 and result["stopped_at_limit"]  # SIGTERM after 3 s; the half-written line is unread
    assert [row for row, _ in result["timed_rows"]] == [{"step": 0, "timing_s/step": 1.0},
                                                        {"step": 1, "timing_s/step": 1.0}]
    first, second = (seconds for _, seconds in result["timed_rows"])
    assert 0.4 < second - first < 2.5 and 3 <= result["wall_s"] < 30
    assert seen == [[0], [0, 1]]


def test_run_watched_kills_a_run_that_ignores_sigterm(tmp_path):
    """A trainer stuck where SIGTERM does not reach it (2026-11-26: a vLLM run) is killed after the grace period, and
    the benchmark goes on to write its summary instead of dying on subprocess.TimeoutExpired."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)"
    result = learning.run_watched([sys.executable, "-c", stubborn], str(tmp_path), dict(os.environ),
                                  str(tmp_path / "run.log"), str(tmp_path / "metrics.jsonl"), "s", timeout_s=1,
                                  grace_s=1)
    assert result["rc"] == -9 and result["stopped_at_limit"] and result["wall_s"] < 30


# -------------------------------------------------------------------------------------------- veRL (--learning)
def test_verl_gets_the_same_grpo_run_under_its_own_keys():
    peer = _load("peer_verl")
    args = peer.parse_args(["--learning", "--out", "/w", "--seed", "2"])
    largs = peer.learning_args(args)
    assert largs.engine == "vllm" and largs.steps == 40 and largs.seed == 2
    budgets = {"actor_budget": 32768, "log_prob_budget": 65536}
    cmd = peer.learning_command(largs, learning.paths("/w"), INFO, "/o", budgets, "v0-rmpad")
    assert cmd[1:3] == ["-m", "verl.trainer.main_ppo"]
    verl = dict(item.split("=", 1) for item in cmd[3:])
    verlx = _overrides(largs)
    same = {  # verlx key: veRL key
        "data.train_files": None, "data.val_files": None, "data.train_batch_size": None,
        "data.max_prompt_length": None, "data.max_response_length": None, "actor_rollout_ref.model.path": None,
        "actor_rollout_ref.actor.optim.lr": None, "actor_rollout_ref.actor.optim.weight_decay": None,
        "actor_rollout_ref.actor.ppo_mini_batch_size": None, "actor_rollout_ref.actor.ppo_epochs": None,
        "actor_rollout_ref.actor.clip_ratio": None, "actor_rollout_ref.actor.grad_clip": None,
        "actor_rollout_ref.actor.loss_agg_mode": None, "actor_rollout_ref.actor.entropy_coeff": None,
        "actor_rollout_ref.rollout.n": None, "actor_rollout_ref.rollout.temperature": None,
        "actor_rollout_ref.rollout.top_p": None, "actor_rollout_ref.rollout.seed": None,
        "actor_rollout_ref.rollout.gpu_memory_utilization": None, "trainer.total_training_steps": None,
        "trainer.test_freq": None, "algorithm.adv_estimator": None, "trainer.seed": "data.seed",
        "custom_reward_function.path": "reward.custom_reward_function.path",
    }
    for verlx_key, verl_key in same.items():
        assert verl[verl_key or verlx_key] == verlx[verlx_key], verlx_key
    for verlx_key, verl_key in {"actor_rollout_ref.actor.use_kl_loss": None, "algorithm.use_kl_in_reward": None,
                                "trainer.val_before_train": None, "algorithm.norm_adv_by_std_in_grpo": None}.items():
        assert verl[verl_key or verlx_key].lower() == verlx[verlx_key], verlx_key
    assert verl["actor_rollout_ref.rollout.name"] == "vllm" and verl["trainer.use_v1"] == "False"
    assert verl["actor_rollout_ref.actor.ppo_max_token_len_per_gpu"] == "32768"
    assert verl["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] == "65536"
    assert verl["actor_rollout_ref.rollout.val_kwargs.do_sample"] == "False"


def test_verl_file_logger_lines_make_the_same_summary():
    peer = _load("peer_verl")
    lines = ['{"step": 0, "data": {"val-core/arithmetic/reward/mean@1": 0.25}}',
             '{"step": 1, "data": {"timing_s/step": 4.0, "critic/score/mean": 0.4, "response_length/mean": 30.0}}',
             '{"step": 2, "data": {"timing_s/step": 3.0, "val-core/arithmetic/reward/mean@1": 0.5, '
             '"timing_s/testing": 1.5, "critic/score/mean": 0.5}}']
    rows = [peer.verl_jsonl_row(line) for line in lines]
    assert rows[0] == {"step": 0, KEY: 0.25, "verl_val_key": KEY}
    timed = list(zip(rows, (40.0, 44.5, 49.0)))
    assert learning.learning_summary(timed, {}, 512) == learning.learning_summary(TIMED_ROWS[:3], {}, 512)
    assert peer.verl_jsonl_row('{"step": 3}') is None


def test_verl_validation_is_read_whatever_data_source_and_prefers_acc():
    peer = _load("peer_verl")
    row = peer.verl_jsonl_row('{"step": 5, "data": {"val-core/unknown/reward/mean@1": 0.5, '
                              '"val-aux/unknown/reward/std@1": 0.1}}')
    assert row[KEY] == 0.5 and row["verl_val_key"] == "val-core/unknown/reward/mean@1"
    row = peer.verl_jsonl_row('{"step": 5, "data": {"val-core/a/reward/mean@1": 0.5, "val-core/a/acc/mean@1": 0.25}}')
    assert row[KEY] == 0.25 and row["verl_val_key"] == "val-core/a/acc/mean@1"


# ------------------------------------------------------------------------------------------------------- report
def _summary(system, seed, curve, engine="native", layout="1gpu", mode="sync", step_s=2.0):
    points = [{"step": s, "accuracy": a, "elapsed_s": t} for s, a, t in curve]
    return {"name": f"{system}-{engine}-{seed}", "system": system, "engine": engine, "layout": layout, "mode": mode,
            "seed": seed, "curve": points, "start_accuracy": points[0]["accuracy"],
            "end_accuracy": points[-1]["accuracy"], "gain": points[-1]["accuracy"] - points[0]["accuracy"],
            "mean_step_s": step_s, "train_s": points[-1]["elapsed_s"]}


SUMMARIES = [
    _summary("verlx", 0, [(0, 0.30, 0.0), (5, 0.55, 10.0), (10, 0.60, 20.0)]),
    _summary("verlx", 1, [(0, 0.28, 0.0), (5, 0.40, 11.0), (10, 0.52, 22.0)]),
    _summary("verl", 0, [(0, 0.30, 0.0), (5, 0.45, 30.0), (10, 0.58, 60.0)], engine="vllm", step_s=6.0),
    _summary("verl", 1, [(0, 0.28, 0.0), (5, 0.44, 31.0), (10, 0.50, 62.0)], engine="vllm", step_s=6.0),
]


def test_report_pools_the_seeds_and_times_the_run_to_verls_final_accuracy(capsys):
    target = report.verl_target(SUMMARIES)
    assert target == pytest.approx(0.54)
    rows = {r["config"]: r for r in report.table(SUMMARIES, target)}
    verlx, verl = rows["verlx native 1gpu"], rows["verl vllm 1gpu"]
    assert verlx["seeds"] == [0, 1] and verlx["end_accuracy"] == pytest.approx(0.56)
    assert verlx["end_accuracy_spread"] == pytest.approx(0.08)
    assert verlx["gain"] == pytest.approx(0.27) and verlx["gain_spread"] == pytest.approx(0.06)  # 0.30 and 0.24
    # seed 0 reaches 54% first at its step-5 validation (10 s); seed 1 never does (52% at the end)
    assert verlx["s_to_target"] == 10.0 and verlx["reached"] == 1
    assert verl["s_to_target"] == 60.0 and verl["reached"] == 1 and verl["mean_step_s"] == 6.0
    report.print_table(list(rows.values()), target)
    out = capsys.readouterr().out
    assert verl["train_s_vs_baseline"] == pytest.approx(61 / 21)
    assert "| verlx native 1gpu | 0,1 | 29.0 | 56.0 ± 4.0 | 27.0 ± 3.0 | 2.00 | 21 | 1.00× | 10 (1/2) |" in out
    assert "| verl vllm 1gpu | 0,1 | 29.0 | 54.0 ± 4.0 | 25.0 ± 3.0 | 6.00 | 61 | 2.90× | 60 (1/2) |" in out
    assert "s to 54.0% |" in out


def test_report_leaves_out_failed_runs_and_names_cut_short_ones(capsys):
    failed, cut = dict(SUMMARIES[0], rc=1, name="f"), dict(SUMMARIES[1], rc=None, name="c")
    # stopped by its own --timeout-s: veRL's trainer exits with SIGABRT (-6) under the SIGTERM; its curve counts
    limited = dict(SUMMARIES[2], rc=-6, stopped_at_limit=True, name="l")
    assert report.usable([failed, cut, limited]) == [cut, limited]
    out = capsys.readouterr().out
    assert "left out: f failed (rc 1) after validating at step 10" in out
    assert "c: cut short, its curve ends at step 10" in out and "l: cut short, its curve ends at step 10" in out


def test_report_draws_accuracy_against_step_and_time(tmp_path):
    for i, summary in enumerate(SUMMARIES):
        (tmp_path / f"s{i}.json").write_text(json.dumps(summary))
    (tmp_path / "sft.json").write_text(json.dumps({"accuracy": 0.3}))  # beside the summaries, not one of them
    assert len(report.load_summaries([str(tmp_path)])) == 4
    written = report.draw(SUMMARIES, str(tmp_path / "images"), "learning")
    assert [os.path.basename(p) for p in written] == ["learning_vs_step.png", "learning_vs_time.png"]
    for path in written:
        with open(path, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(SystemExit, match="no learning summaries"):
        report.load_summaries([str(tmp_path / "sft.json")])


# ------------------------------------------------------------------------------------------- the whole pipeline
def _run(cmd, out_dir) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_smoke_runs_data_sft_and_grpo_then_verl_reuses_the_sft_model(tmp_path):
    work, out = tmp_path / "work", tmp_path / "out"
    proc = _run([sys.executable, "benchmarks/learning_gpu.py", "--smoke", "--out", str(work)], out)
    info = json.loads((work / "data" / "info.json").read_text())
    assert info["sizes"] == {"test": 8, "val": 8, "train": 256} and info["parameters"] == 90_880
    rl_rows = pq.read_table(work / "data" / "rl_train.parquet").to_pylist()
    assert rl_rows == pq.read_table(work / "data" / "train.parquet").to_pylist()[:64]
    sft = json.loads((out / "learning" / "sft.json").read_text())
    assert sft["rc"] == 0 and sft["steps"] == 30 and [v["step"] for v in sft["validations"]] == [10, 20, 30]
    summary = json.loads((out / "learning" / "verlx-native-1gpu-sync-s0.json").read_text())
    assert summary == json.loads((work / "runs" / "verlx-native-1gpu-sync-s0" / "summary.json").read_text())
    assert summary["rc"] == 0 and [c["step"] for c in summary["curve"]] == [0, 1, 2]
    assert [s["step"] for s in summary["steps"]] == [1, 2] and summary["samples_per_step"] == 8
    assert all(0.0 <= c["accuracy"] <= 1.0 for c in summary["curve"])
    assert summary["curve"][0]["elapsed_s"] == 0.0 <= summary["curve"][1]["elapsed_s"] <= summary["curve"][2][
        "elapsed_s"]
    assert summary["device"] == "cpu" and summary["sft_accuracy"] == sft["accuracy"]
    assert "| verlx-native-1gpu-sync-s0 | 0 |" in proc.stdout
    assert "8 held-out prompts cannot resolve a 15-point gain" in proc.stdout

    peer = _run([sys.executable, "benchmarks/peer_verl.py", "--learning", "--smoke", "--out", str(work)], out)
    assert "data: cached" in peer.stdout and "sft: cached" in peer.stdout
    tried = json.loads((out / "learning" / "verl-tried-s0.json").read_text())
    assert [t["attempt"] for t in tried["tried"]] == ["v1-rmpad", "v0-rmpad", "v1-padded", "v1-padded-fixed"]
    assert tried["budgets"]["from"].endswith("verlx-native-1gpu-sync-s0/run.log")  # the CPU run's 16384
    assert all("ppo_max_token_len_per_gpu=16384" in t["command"] for t in tried["tried"][:3])
    assert "actor_rollout_ref.actor.use_dynamic_bsz=False" in tried["tried"][3]["command"]
    assert all(f"actor_rollout_ref.model.path={work}/sft_model" in t["command"] for t in tried["tried"])
