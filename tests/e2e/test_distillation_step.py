"""On-policy distillation through `python -m verlx.trainer.main_ppo` on 2 CPU workers: the tiny model learns from a
second tiny checkpoint (same tokenizer, other seed) as its teacher, with veRL's distillation keys; the step runs the
teacher phase and reports the distillation/* metrics."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from helpers.distillation import script_distillation_overrides
from helpers.e2e import e2e_overrides, read_metrics
from helpers.tiny_tokenizer import save_tiny_qwen2

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory):
    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny_teacher"), seed=1)


def test_main_ppo_trains_the_student_towards_a_colocated_teacher(tiny_model_dir, teacher_dir, arithmetic_data_dir,
                                                                  tmp_path):
    overrides = e2e_overrides(
        tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
        "trainer.total_training_steps=2", *script_distillation_overrides(str(teacher_dir)))
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "verlx.trainer.main_ppo", *overrides], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    # the mapping is said once at start, naming the keys that are read and not used
    log = run.stdout + run.stderr
    assert log.count("distillation: the teacher") == 1, log[-4000:]
    assert "distillation.n_gpus_per_node=4, nnodes=1" in log
    rows = read_metrics(tmp_path)
    assert [r["training/global_step"] for r in rows] == [1, 2]
    for row in rows:
        names = ("distillation/loss", "distillation/loss_min", "distillation/loss_max", "distillation/abs_loss",
                 "distillation/pg_clipfrac", "distillation/ppo_kl", "timing_s/teacher")
        for name in names:
            assert math.isfinite(row[name]), (name, row[name])
        # k1 = log s - log t is negative and positive across tokens of two different random models
        assert row["distillation/loss_min"] < 0 < row["distillation/loss_max"]
        assert row["distillation/abs_loss"] > 0
    with open(tmp_path / "metrics.jsonl") as f:
        assert all("actor/pg_loss" in json.loads(line) for line in f)  # computed for its metrics, as in veRL


def test_forward_kl_topk_runs_the_teachers_top_k_through_the_step(tiny_model_dir, teacher_dir, arithmetic_data_dir,
                                                                   tmp_path):
    """loss_mode=forward_kl_topk: the teacher's top-k ids and log-probs travel from its phase to the update (one
    step on 2 CPU workers) and the step reports the mass both models put on them."""
    overrides = e2e_overrides(
        tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
        "trainer.total_training_steps=1", *script_distillation_overrides(str(teacher_dir)),
        "distillation.distillation_loss.loss_mode=forward_kl_topk", "distillation.distillation_loss.topk=16",
        "distillation.distillation_loss.use_policy_gradient=false")
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    run = subprocess.run([sys.executable, "-m", "verlx.trainer.main_ppo", *overrides], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    (row,) = read_metrics(tmp_path)
    for name in ("distillation/loss", "distillation/student_mass", "distillation/teacher_mass", "timing_s/teacher"):
        assert math.isfinite(row[name]), (name, row[name])
    # 16 of the tiny vocabulary's tokens: some of the mass, not all, under either model
    assert 0 < row["distillation/student_mass"] < 1 and 0 < row["distillation/teacher_mass"] < 1
    assert "distillation/pg_clipfrac" not in row  # minimised directly: no PPO loss of its own
