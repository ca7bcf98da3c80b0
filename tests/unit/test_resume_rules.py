"""What a resume does with settings changed since the checkpoint: every key has a rule; a new value of most keys takes
effect, keys that give the saved state or data position its meaning must match."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import os

import pytest

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer import checkpointing
from verlx.trainer.resume import (
    MUST_MATCH,
    NOT_COMPARED,
    TAKES_EFFECT,
    NothingToDo,
    ResumeRefused,
    architecture_changes,
    config_changes,
    flatten,
    plan_resume,
    rule_for,
    stop_if_finished,
)


def config(*overrides) -> PPOConfig:
    return build(PPOConfig, to_container(load_yaml(overrides=list(overrides))))


def saved_form(cfg: PPOConfig) -> dict:
    """The config as the checkpoint's config.json holds it."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))


def test_every_key_of_the_config_has_a_rule():
    keys = flatten(dataclasses.asdict(config()))
    assert [k for k in keys if rule_for(k) is None] == []


@pytest.mark.parametrize("key,policy", [
    ("actor_rollout_ref.actor.optim.lr", TAKES_EFFECT),
    ("actor_rollout_ref.actor.optim.betas", TAKES_EFFECT),
    ("actor_rollout_ref.actor.clip_ratio", TAKES_EFFECT),
    ("actor_rollout_ref.actor.entropy_coeff", TAKES_EFFECT),
    ("algorithm.kl_ctrl.kl_coef", TAKES_EFFECT),
    ("trainer.total_training_steps", TAKES_EFFECT),
    ("trainer.n_gpus_per_node", TAKES_EFFECT),  # checkpoints are resharded on load
    ("actor_rollout_ref.rollout.engine_kwargs.custom.anything", TAKES_EFFECT),
    ("actor_rollout_ref.actor.strategy", MUST_MATCH),
    ("actor_rollout_ref.actor.optim.optimizer", MUST_MATCH),
    ("actor_rollout_ref.model.lora_rank", MUST_MATCH),
    ("critic.model.lora_alpha", MUST_MATCH),
    ("actor_rollout_ref.model.path", MUST_MATCH),
    ("data.train_files", MUST_MATCH),
    ("data.train_batch_size", MUST_MATCH),
    ("actor_rollout_ref.rollout.n", MUST_MATCH),
    ("trainer.seed", MUST_MATCH),
    ("trainer.resume_mode", NOT_COMPARED),
])
def test_rules(key, policy):
    assert rule_for(key)[0] == policy


def test_changes_are_listed_with_old_and_new_values():
    before = config("actor_rollout_ref.actor.optim.lr=1e-4", "data.train_batch_size=8", "trainer.resume_mode=auto")
    after = config("actor_rollout_ref.actor.optim.lr=5e-4", "data.train_batch_size=16",
                   "trainer.resume_mode=resume_path", "+actor_rollout_ref.rollout.engine_kwargs.custom.k=1")
    changes = config_changes(saved_form(before), dataclasses.asdict(after))
    assert [(str(c), c.policy) for c in changes] == [
        ("actor_rollout_ref.actor.optim.lr: 0.0001 -> 0.0005", TAKES_EFFECT),
        ("actor_rollout_ref.rollout.engine_kwargs.custom.k: (unset) -> 1", TAKES_EFFECT),
        ("data.train_batch_size: 8 -> 16", MUST_MATCH),
    ]


def test_a_must_match_key_an_older_checkpoint_did_not_record_is_not_refused():
    saved = saved_form(config())
    del saved["actor_rollout_ref"]["model"]["exclude_modules"]
    assert config_changes(saved, dataclasses.asdict(config("actor_rollout_ref.model.exclude_modules=[x]"))) == []


def test_architecture_changes_are_named(tmp_path):
    (tmp_path / "actor" / "huggingface").mkdir(parents=True)
    (tmp_path / "actor" / "huggingface" / "config.json").write_text(json.dumps({"hidden_size": 64, "vocab_size": 9}))

    class HF:
        hidden_size, vocab_size = 128, 9

    assert architecture_changes(str(tmp_path), HF()) == [
        "model config hidden_size: 64 in the checkpoint, 128 in actor_rollout_ref.model.path"]


def write_checkpoint(root, step: int, cfg: PPOConfig, critic: bool = False) -> str:
    tmp = checkpointing.temp_step_dir(str(root), step)
    for rel in checkpointing.required_files(critic):
        if rel != checkpointing.COMPLETE:
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            open(os.path.join(tmp, rel), "w").close()
    checkpointing.write_driver_state(tmp, {"global_step": step, "dataloader": {}}, dataclasses.asdict(cfg))
    return checkpointing.finalize(tmp, str(root), step, critic)


def run_config(root, *overrides) -> PPOConfig:
    return config(f"trainer.default_local_dir={root}", "algorithm.adv_estimator=grpo", *overrides)


def test_refusal_lists_every_key_that_must_match_and_what_to_do(tmp_path):
    path = write_checkpoint(tmp_path, 2, run_config(tmp_path))
    now = run_config(tmp_path, "data.train_batch_size=16", "actor_rollout_ref.model.lora_rank=8",
                     "algorithm.adv_estimator=gae", "actor_rollout_ref.actor.optim.lr=1e-3")
    with pytest.raises(ResumeRefused) as info:
        plan_resume(now, None, total_steps=10, use_critic=True)
    assert isinstance(info.value, ConfigError)  # exit code 2 from the entrypoint
    text = str(info.value)
    assert text.startswith(f"cannot resume from {path}: these settings must match the checkpoint:\n")
    assert "  - actor_rollout_ref.model.lora_rank: 0 in the checkpoint, 8 now (" in text
    assert "  - data.train_batch_size: 1024 in the checkpoint, 16 now (" in text
    assert "this run trains a critic (algorithm.adv_estimator=gae) but the checkpoint has none" in text
    assert "trainer.resume_mode=disable" in text and "optim.lr" not in text


def test_changes_that_take_effect_are_logged_one_line_each(tmp_path, caplog):
    path = write_checkpoint(tmp_path, 2, run_config(tmp_path, "actor_rollout_ref.actor.optim.lr=1e-4"))
    now = run_config(tmp_path, "actor_rollout_ref.actor.optim.lr=5e-4", "algorithm.kl_ctrl.kl_coef=0.01")
    with caplog.at_level(logging.INFO, logger="verlx.trainer.resume"):
        point = plan_resume(now, None, total_steps=10, use_critic=False)
    assert point.path == path and point.state["global_step"] == 2 and not point.finished
    assert point.changed_keys == {"actor_rollout_ref.actor.optim.lr", "algorithm.kl_ctrl.kl_coef"}
    lines = [r.getMessage() for r in caplog.records if "changed since the checkpoint" in r.getMessage()]
    assert lines == [
        f"resuming from {path}: changed since the checkpoint: actor_rollout_ref.actor.optim.lr: 0.0001 -> 0.0005 "
        "(takes effect)",
        f"resuming from {path}: changed since the checkpoint: algorithm.kl_ctrl.kl_coef: 0.001 -> 0.01 (takes effect)",
    ]


def test_finished_run_is_nothing_to_do_unless_allowed_or_validating(tmp_path, caplog):
    cfg = run_config(tmp_path)
    path = write_checkpoint(tmp_path, 4, cfg)
    point = plan_resume(copy.deepcopy(cfg), None, total_steps=4, use_critic=False)
    assert point.finished  # loading it is fine (export, inspection); running it is not
    with pytest.raises(NothingToDo, match=rf"^nothing to do: already at step 4 of 4 \(checkpoint {path}\)\. "):
        stop_if_finished(point, cfg.trainer, total_steps=4)
    assert not stop_if_finished(plan_resume(copy.deepcopy(cfg), None, 5, False), cfg.trainer, total_steps=5)
    allowed = run_config(tmp_path, "trainer.allow_finished_resume=true")
    with caplog.at_level(logging.WARNING, logger="verlx.trainer.resume"):
        assert stop_if_finished(plan_resume(allowed, None, 4, False), allowed.trainer, total_steps=4)
    assert "nothing to do: already at step 4 of 4" in caplog.text
    validating = run_config(tmp_path, "trainer.val_only=true")
    assert not plan_resume(validating, None, total_steps=4, use_critic=False).finished
