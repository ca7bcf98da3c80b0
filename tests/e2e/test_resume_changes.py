"""Resuming through main_ppo when the settings or the checkpoint changed since the save: a new lr takes effect (and
is logged), a change that must match is refused, a finished run has nothing to do, a damaged newest checkpoint is
skipped for the newest intact one. One trained run (2 steps, a checkpoint after each) is shared by all tests."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys

import pytest

from helpers.e2e import e2e_overrides, make_config, read_metrics
from verlx.config.loader import ConfigError
from verlx.trainer import checkpointing
from verlx.trainer.main_ppo import run_ppo
from verlx.trainer.resume import NothingToDo, ResumeRefused

COMPARED = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "response_length/mean")
GRPO = ("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.entropy_coeff=0.01",
        "trainer.save_freq=1", "trainer.total_training_steps=2")


def overrides(run_dir, *extra) -> list[str]:
    return e2e_overrides(run_dir.model, run_dir.data, run_dir.out, *GRPO, *extra)


def config(run_dir, *extra):
    return make_config(run_dir.model, run_dir.data, run_dir.out, *GRPO, *extra)


class RunDir:
    def __init__(self, model, data, out):
        self.model, self.data, self.out = model, data, out

    def copy_to(self, dest) -> RunDir:
        """The trained run's checkpoints in a directory of one test's own (its metrics start empty)."""
        shutil.copytree(os.path.join(self.out, "ckpt"), os.path.join(dest, "ckpt"))
        return RunDir(self.model, self.data, str(dest))


@pytest.fixture(scope="module")
def trained(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path_factory):
    run_dir = RunDir(tiny_model_dir, arithmetic_data_dir, str(tmp_path_factory.mktemp("trained")))
    run_ppo(config(run_dir))
    assert checkpointing.complete_steps(os.path.join(run_dir.out, "ckpt")) == [1, 2]
    assert [r["actor/lr"] for r in read_metrics(run_dir.out)] == [1e-3, 1e-3]
    return run_dir


def test_finished_run_has_nothing_to_do_and_exits_1_without_a_traceback(trained, tmp_path):
    with pytest.raises(NothingToDo, match=r"^nothing to do: already at step 2 of 2 "):
        run_ppo(config(trained))
    command = [sys.executable, "-m", "verlx.trainer.main_ppo", *overrides(trained)]
    refused = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert refused.returncode == 1, refused.stderr[-3000:]
    assert "nothing to do: already at step 2 of 2" in refused.stderr and "Traceback" not in refused.stderr
    allowed = subprocess.run([*command, "trainer.allow_finished_resume=true"], capture_output=True, text=True,
                             cwd=tmp_path, timeout=300)
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert "nothing to do: already at step 2 of 2" in allowed.stdout + allowed.stderr
    assert len(read_metrics(trained.out)) == 2  # nothing was trained, no worker was started


def test_a_change_that_must_match_is_refused_before_any_worker_starts(trained):
    with pytest.raises(ResumeRefused) as info:
        run_ppo(config(trained, "actor_rollout_ref.rollout.n=4", "trainer.total_training_steps=3"))
    text = str(info.value)
    assert "actor_rollout_ref.rollout.n: 2 in the checkpoint, 4 now" in text and "trainer.resume_mode=disable" in text
    assert len(read_metrics(trained.out)) == 2


def test_changed_lr_takes_effect_on_resume_and_is_logged(trained, tmp_path, caplog):
    run_dir = trained.copy_to(tmp_path)
    with caplog.at_level(logging.INFO, logger="verlx.trainer.resume"):
        run_ppo(config(run_dir, "actor_rollout_ref.actor.optim.lr=5e-3", "trainer.total_training_steps=3"))
    newest = checkpointing.step_dir(os.path.join(run_dir.out, "ckpt"), 2)
    for line in ("actor_rollout_ref.actor.optim.lr: 0.001 -> 0.005 (takes effect)",
                 "trainer.total_training_steps: 2 -> 3 (takes effect)"):
        assert f"resuming from {newest}: changed since the checkpoint: {line}" in caplog.text
    (row,) = read_metrics(run_dir.out)
    assert row["step"] == 3 and row["actor/lr"] == 5e-3


def test_damaged_newest_checkpoint_falls_back_to_the_previous_one(trained, tmp_path, caplog):
    run_dir = trained.copy_to(tmp_path)
    root = os.path.join(run_dir.out, "ckpt")
    newest = checkpointing.step_dir(root, 2)
    shard = "actor/dcp/__1_0.distcp"
    with open(os.path.join(newest, shard), "r+b") as f:
        f.truncate(64)
    with pytest.raises(ConfigError, match=rf"cannot resume from {newest}: size differs .*: {shard} \(64 bytes, "):
        run_ppo(config(run_dir, "trainer.resume_mode=resume_path", f"trainer.resume_from_path={newest}"))
    with caplog.at_level(logging.WARNING, logger="verlx.trainer.checkpointing"):
        run_ppo(config(run_dir))
    assert f"checkpoint {newest} is damaged and is skipped: size differs from the manifest" in caplog.text
    assert shard in caplog.text
    (row,) = read_metrics(run_dir.out)  # step 2 was trained again from step 1, as in the original run
    reference = read_metrics(trained.out)[1]
    assert row["step"] == 2
    for key in COMPARED:
        assert row[key] == pytest.approx(reference[key], abs=1e-6), key
    assert checkpointing.checkpoint_damage(newest) is None  # replaced by the new save
