"""Hugging Face hub ids as model paths: resolved through the HF cache in the driver, refused clearly when offline
and not cached. No test touches the network: the cache is built on disk and HF_HUB_OFFLINE=1."""

from __future__ import annotations

import pytest

from helpers.commands import assert_no_traceback, run_module
from helpers.e2e import make_config
from helpers.hf_cache import cache_model, offline_env
from verlx.config.loader import ConfigError

HUB_ID = "verlx-test/tiny-qwen"


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """An empty HF cache in tmp_path, offline, for this process (huggingface_hub reads its constants at call time)."""
    from huggingface_hub import constants

    cache = tmp_path / "hf-cache"
    cache.mkdir()
    for name, value in offline_env(cache).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_local_paths_and_non_ids_are_left_alone(tmp_path):
    from verlx.config.hf_paths import is_hub_id, resolve_model_path

    (tmp_path / "org").mkdir()
    (tmp_path / "org" / "name").mkdir()
    assert not is_hub_id(str(tmp_path / "org" / "name")) and not is_hub_id("~/models/x") and not is_hub_id("tiny")
    assert is_hub_id("Qwen/Qwen2.5-0.5B-Instruct")
    assert resolve_model_path("~/models/x", "k") == "~/models/x"


def test_cached_hub_id_resolves_to_its_snapshot(offline_cache, tiny_model_dir, arithmetic_data_dir, tmp_path):
    from verlx.trainer.main_ppo import prepare

    snapshot = cache_model(offline_cache, HUB_ID, tiny_model_dir)
    cfg = make_config(HUB_ID, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=gae",
                      f"critic.model.path={HUB_ID}", f"actor_rollout_ref.model.tokenizer_path={HUB_ID}")
    _, tokenizer, train_loader, _, reward_fn = prepare(cfg)
    reward_fn.close()
    model = cfg.actor_rollout_ref.model
    assert model.path == model.tokenizer_path == cfg.critic.model.path == snapshot
    assert len(tokenizer) == 100 and next(iter(train_loader)).batch["input_ids"].shape == (8, 32)


def test_a_distillation_teachers_hub_id_resolves_too(offline_cache, tiny_model_dir, arithmetic_data_dir, tmp_path):
    from verlx.trainer.main_ppo import resolve_hub_models

    snapshot = cache_model(offline_cache, HUB_ID, tiny_model_dir)
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "distillation.enabled=true",
                      f"distillation.teacher_models.teacher_model.model_path={HUB_ID}")
    resolve_hub_models(cfg)
    assert cfg.distillation.teacher.model_path == snapshot


def test_uncached_hub_id_offline_names_the_id_and_the_download_command(offline_cache, arithmetic_data_dir, tmp_path):
    from verlx.trainer.main_ppo import prepare

    cfg = make_config("Qwen/Qwen2.5-0.5B-Instruct", arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "critic.model.path=Qwen/Qwen2.5-7B-Instruct")  # grpo has no critic: its path is not resolved
    with pytest.raises(ConfigError) as info:
        prepare(cfg)
    (problem,) = info.value.problems
    assert problem.startswith("actor_rollout_ref.model.path='Qwen/Qwen2.5-0.5B-Instruct': not a local directory, "
                              "and the Hugging Face model Qwen/Qwen2.5-0.5B-Instruct is not (completely) in the local "
                              f"cache {offline_cache}, and HF_HUB_OFFLINE=1 is set.")
    assert "`hf download Qwen/Qwen2.5-0.5B-Instruct`" in problem


def test_main_ppo_refuses_an_uncached_hub_id_offline(tmp_path, arithmetic_data_dir):
    result = run_module([f"data.train_files={arithmetic_data_dir}/train.parquet",
                         f"data.val_files={arithmetic_data_dir}/test.parquet", "trainer.device=cpu",
                         "actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct"],
                        cwd=tmp_path, env=offline_env(tmp_path / "cache"))
    assert result.returncode == 2
    assert "actor_rollout_ref.model.path='Qwen/Qwen2.5-0.5B-Instruct': not a local directory" in result.stderr
    assert "HF_HUB_OFFLINE=1 is set" in result.stderr and "hf download Qwen/Qwen2.5-0.5B-Instruct" in result.stderr
    assert_no_traceback(result)


def test_main_sft_refuses_an_uncached_hub_id_offline(tmp_path):
    result = run_module(["model.partial_pretrain=Qwen/Qwen2.5-0.5B-Instruct", "trainer.device=cpu"],
                        module="verlx.trainer.main_sft", cwd=tmp_path, env=offline_env(tmp_path / "cache"))
    assert result.returncode == 2
    assert "model.partial_pretrain='Qwen/Qwen2.5-0.5B-Instruct': not a local directory" in result.stderr
    assert_no_traceback(result)
