"""Driver-side checkpoint directories: completeness, resume resolution, incompatible changes, NaN guard."""

from __future__ import annotations

import json
import os

import pytest
import torch

from verlx.config.run import TrainerConfig
from verlx.trainer import checkpointing
from verlx.workers.guarded_step import GuardedStepper, NonFiniteUpdates
from verlx.workers.stats import MetricAccumulator


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
    assert checkpointing.resolve_resume_path(cfg, use_critic=False) == str(tmp_path / "global_step_10")
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "10"


def test_incomplete_temp_directory_is_never_finalized(tmp_path):
    tmp = checkpointing.temp_step_dir(str(tmp_path), 3)
    os.makedirs(os.path.join(tmp, "actor"))
    with pytest.raises(RuntimeError, match="incomplete"):
        checkpointing.finalize(tmp, str(tmp_path), 3, use_critic=False)
    assert checkpointing.complete_steps(str(tmp_path)) == []


def test_explicit_resume_path_errors_name_missing_files(tmp_path):
    cfg = TrainerConfig(resume_mode="resume_path", resume_from_path=str(tmp_path / "nope"))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        checkpointing.resolve_resume_path(cfg, use_critic=False)
    partial = tmp_path / "global_step_4"
    (partial / "actor" / "dcp").mkdir(parents=True)
    (partial / "data.pt").write_bytes(b"")
    cfg = TrainerConfig(resume_mode="resume_path", resume_from_path=str(partial))
    with pytest.raises(FileNotFoundError) as info:
        checkpointing.resolve_resume_path(cfg, use_critic=True)
    text = str(info.value)
    assert "COMPLETE" in text and "actor/dcp/.metadata" in text and "critic/dcp/.metadata" in text


def test_disable_ignores_checkpoints(tmp_path):
    make_complete(tmp_path, 1)
    assert checkpointing.resolve_resume_path(TrainerConfig(default_local_dir=str(tmp_path),
                                                           resume_mode="disable"), False) is None


def test_prune_keeps_the_newest(tmp_path):
    for s in (1, 2, 3):
        make_complete(tmp_path, s)
    assert checkpointing.prune(str(tmp_path), 2) == [1]
    assert checkpointing.complete_steps(str(tmp_path)) == [2, 3]


def test_breaking_config_changes_are_named(tmp_path):
    step = tmp_path / "global_step_1"
    (step / "actor" / "huggingface").mkdir(parents=True)
    saved = {"actor_rollout_ref": {"actor": {"strategy": "fsdp", "optim": {"optimizer": "AdamW"}},
                                   "model": {"lora_rank": 0, "target_modules": "all-linear"}},
             "critic": {"strategy": "fsdp"}}
    (step / "config.json").write_text(json.dumps(saved))
    (step / "actor" / "huggingface" / "config.json").write_text(json.dumps({"hidden_size": 64, "vocab_size": 100}))
    now = json.loads(json.dumps(saved))
    now["actor_rollout_ref"]["model"]["lora_rank"] = 8

    class HF:
        hidden_size, vocab_size = 128, 100

    problems = checkpointing.resume_incompatibilities(str(step), now, HF())
    assert problems == [
        "actor_rollout_ref.model.lora_rank was 0 when the checkpoint was saved and is 8 now",
        "model config hidden_size was 64 in the checkpoint and is 128 in actor_rollout_ref.model.path",
    ]


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
