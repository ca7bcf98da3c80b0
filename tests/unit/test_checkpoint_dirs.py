"""Driver-side checkpoint directories: completeness, resume resolution, NaN guard."""

from __future__ import annotations

import os

import pytest
import torch

from verlx.config.loader import ConfigError
from verlx.config.run import TrainerConfig
from verlx.metrics.accumulator import MetricAccumulator
from verlx.trainer import checkpointing
from verlx.workers.guarded_step import GuardedStepper, NonFiniteUpdates


def make_complete(root, step, critic=False):
    tmp = checkpointing.temp_step_dir(str(root), step)
    for f in checkpointing.required_files(critic):
        if f != checkpointing.COMPLETE:
            os.makedirs(os.path.dirname(os.path.join(tmp, f)) or tmp, exist_ok=True)
            open(os.path.join(tmp, f), "w").close()
    return checkpointing.finalize(tmp, str(root), step, critic)


def test_finalize_renames_and_latest_picks_highest_complete(tmp_path):
    make_complete(tmp_path, 2)
    make_complete(tmp_path, 10)
    os.makedirs(tmp_path / "global_step_12" / "actor")  # no COMPLETE marker: never picked
    cfg = TrainerConfig(default_local_dir=str(tmp_path), resume_mode="auto")
    assert checkpointing.resolve_resume_path(cfg) == str(tmp_path / "global_step_10")
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "10"


def test_incomplete_temp_directory_is_never_finalized(tmp_path):
    tmp = checkpointing.temp_step_dir(str(tmp_path), 3)
    os.makedirs(os.path.join(tmp, "actor"))
    with pytest.raises(RuntimeError, match="incomplete"):
        checkpointing.finalize(tmp, str(tmp_path), 3, use_critic=False)
    assert checkpointing.complete_steps(str(tmp_path)) == []


def test_explicit_resume_path_errors_name_missing_files(tmp_path):
    cfg = TrainerConfig(resume_mode="resume_path", resume_from_path=str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="does not exist"):
        checkpointing.resolve_resume_path(cfg)
    partial = tmp_path / "global_step_4"
    (partial / "actor" / "dcp").mkdir(parents=True)
    (partial / "critic").mkdir()
    (partial / "data.pt").write_bytes(b"")
    cfg = TrainerConfig(resume_mode="resume_path", resume_from_path=str(partial))
    with pytest.raises(ConfigError) as info:
        checkpointing.resolve_resume_path(cfg)
    text = str(info.value)
    assert f"trainer.resume_from_path={partial}" in text and "no COMPLETE marker" in text
    assert "actor/dcp/.metadata" in text and "critic/dcp/.metadata" in text and "data.pt" not in text


def test_disable_ignores_checkpoints(tmp_path):
    make_complete(tmp_path, 1)
    assert checkpointing.resolve_resume_path(TrainerConfig(default_local_dir=str(tmp_path),
                                                           resume_mode="disable")) is None


def test_prune_keeps_the_newest(tmp_path):
    for s in (1, 2, 3):
        make_complete(tmp_path, s)
    assert checkpointing.prune(str(tmp_path), 2, newest=3) == [1]
    assert checkpointing.complete_steps(str(tmp_path)) == [2, 3]


def test_prune_never_deletes_the_checkpoint_just_saved_for_newer_ones(tmp_path):
    """A run resumed from step 2 (step 4 damaged, or resume_from_path chose an older one) saves step 3: the
    checkpoints it counts are its own and older ones, not step 4, which it will replace when it gets there."""
    for s in (1, 2, 3, 4):
        make_complete(tmp_path, s)
    assert checkpointing.prune(str(tmp_path), 1, newest=3) == [1, 2]
    assert checkpointing.complete_steps(str(tmp_path)) == [3, 4]


def test_nonfinite_gradients_skip_the_step_and_stop_after_n_in_a_row():
    layer = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(layer.parameters(), lr=1.0)
    stepper = GuardedStepper("actor", max_consecutive_nonfinite=2)
    before = layer.weight.detach().clone()
    metrics = MetricAccumulator(torch.device("cpu"))
    (layer(torch.tensor([[float("nan"), 1.0]])).sum()).backward()
    stepper.step(layer, opt, grad_clip=1.0, metrics=metrics)
    assert torch.equal(layer.weight, before)  # skipped
    layer(torch.ones(1, 2)).sum().backward()
    stepper.step(layer, opt, grad_clip=1.0, metrics=metrics)
    assert not torch.equal(layer.weight, before)  # a finite step resets the count
    for i in range(2):
        opt.zero_grad()
        (layer(torch.tensor([[float("inf"), 1.0]])).sum()).backward()
        if i == 0:
            stepper.step(layer, opt, grad_clip=1.0, metrics=metrics)
        else:
            with pytest.raises(NonFiniteUpdates, match="2 consecutive actor updates"):
                stepper.step(layer, opt, grad_clip=1.0, metrics=metrics)
    assert metrics.reduce()["actor/nonfinite_updates_skipped"] == 3.0  # the NaN one and both infs
