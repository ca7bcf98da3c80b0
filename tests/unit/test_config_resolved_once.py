"""The driver resolves its config once, in main_ppo.prepare (engine name, total steps, hub paths, veRL keys), before
Ray; the trainer built from it, its resume plan and a restart after a worker died leave it unchanged."""

from __future__ import annotations

import copy

import pytest

from helpers.e2e import make_config
from verlx.trainer.main_ppo import prepare
from verlx.trainer.ppo_trainer import RayPPOTrainer


def _trainer(cfg):
    use_gpu, tokenizer, train_loader, val_loader, reward = prepare(cfg)
    return RayPPOTrainer(cfg, tokenizer, train_loader, val_loader, reward, reward, use_gpu), train_loader


def test_prepare_resolves_the_totals_and_the_engine_and_nothing_changes_the_config_afterwards(
        tiny_model_dir, arithmetic_data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "trainer.total_training_steps=null",
                      "trainer.total_epochs=3", "actor_rollout_ref.rollout.name=auto", "trainer.resume_mode=disable")
    trainer, train_loader = _trainer(cfg)
    # 3 epochs of the loader's batches of 8 prompts (the arithmetic split's rows // 8, drop_last)
    assert cfg.trainer.total_training_steps == 3 * (len(train_loader.dataset) // 8) == trainer.total_steps
    assert cfg.actor_rollout_ref.rollout.name in ("sglang", "vllm", "native", "hf")
    resolved = copy.deepcopy(cfg)
    trainer.plan_resume()
    trainer.prepare_restart()
    assert trainer.resume_mode == "auto"
    assert trainer.plan_resume() is None  # auto: no checkpoint in default_local_dir yet
    assert cfg == resolved


def test_a_trainer_needs_the_resolved_config(tiny_model_dir, arithmetic_data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "trainer.total_training_steps=null")
    _, tokenizer, train_loader, val_loader, reward = prepare(copy.deepcopy(cfg))
    with pytest.raises(ValueError, match="total_training_steps is unresolved"):
        RayPPOTrainer(cfg, tokenizer, train_loader, val_loader, reward, reward, False)
