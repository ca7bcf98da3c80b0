"""A model directory without tokenizer files is refused before Ray starts, naming the directory and the files
(transformers would build a 1-token tokenizer from it and every prompt would become 0 tokens)."""

from __future__ import annotations

import os
import shutil

import pytest

from helpers.commands import assert_no_traceback, run_module
from helpers.e2e import make_config
from verlx.config.loader import ConfigError

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja",
                   "vocab.json", "merges.txt")


@pytest.fixture
def no_tokenizer_dir(tiny_model_dir, tmp_path):
    """The tiny model (config, weights, generation config) without any tokenizer file."""
    path = tmp_path / "weights-only"
    shutil.copytree(tiny_model_dir, path, ignore=shutil.ignore_patterns(*TOKENIZER_FILES))
    assert os.path.isfile(path / "config.json")
    return str(path)


def test_prepare_refuses_a_model_directory_without_tokenizer_files(no_tokenizer_dir, arithmetic_data_dir, tmp_path):
    import ray

    from verlx.trainer.main_ppo import prepare

    cfg = make_config(no_tokenizer_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo")
    with pytest.raises(ConfigError) as info:
        prepare(cfg)
    (problem,) = info.value.problems
    assert problem == (
        f"actor_rollout_ref.model.path: {no_tokenizer_dir} has no tokenizer files (expected tokenizer.json "
        "(+ tokenizer_config.json), or vocab.json + merges.txt, or a SentencePiece tokenizer.model, or vocab.txt, or "
        "*.tiktoken); set actor_rollout_ref.model.tokenizer_path to a directory that has them (e.g. the base model), "
        f"or copy the base model's tokenizer files into {no_tokenizer_dir}")
    assert not ray.is_initialized()


def test_a_separate_tokenizer_path_is_used_and_checked(no_tokenizer_dir, tiny_model_dir, arithmetic_data_dir, tmp_path):
    from verlx.trainer.main_ppo import prepare

    cfg = make_config(no_tokenizer_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      f"actor_rollout_ref.model.tokenizer_path={tiny_model_dir}")
    _, tokenizer, train_loader, _, reward_fn = prepare(cfg)
    reward_fn.close()
    assert len(tokenizer) == 100 and len(train_loader) == 8
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      f"actor_rollout_ref.model.tokenizer_path={no_tokenizer_dir}")
    with pytest.raises(ConfigError, match=f"actor_rollout_ref.model.tokenizer_path: {no_tokenizer_dir} has no "
                       "tokenizer files .*; point actor_rollout_ref.model.tokenizer_path at a directory that has them"):
        prepare(cfg)


def test_a_one_token_vocabulary_is_refused(no_tokenizer_dir):
    """What transformers builds from a directory without vocabulary, if files of an unknown format fooled the check."""
    from transformers import AutoTokenizer

    from verlx.workers.tokenizer import vocabulary_problem

    empty = AutoTokenizer.from_pretrained(no_tokenizer_dir)
    assert len(empty) <= 1 and empty("12+3=")["input_ids"] == []
    assert vocabulary_problem(empty, no_tokenizer_dir, "model.path") == (
        f"model.path: the tokenizer loaded from {no_tokenizer_dir} has {len(empty)} token(s), so every prompt would "
        "be empty: its tokenizer files (tokenizer.json (+ tokenizer_config.json), or vocab.json + merges.txt, or a "
        "SentencePiece tokenizer.model, or vocab.txt, or *.tiktoken) are missing or broken; set model.tokenizer_path "
        f"to a directory that has them (e.g. the base model), or copy the base model's tokenizer files into "
        f"{no_tokenizer_dir}")


def test_main_ppo_exits_2_before_ray(no_tokenizer_dir, arithmetic_data_dir, tmp_path):
    result = run_module([f"data.train_files={arithmetic_data_dir}/train.parquet",
                         f"data.val_files={arithmetic_data_dir}/test.parquet", "trainer.device=cpu",
                         "trainer.n_gpus_per_node=2", "data.train_batch_size=8",
                         "actor_rollout_ref.actor.ppo_mini_batch_size=4", "algorithm.adv_estimator=grpo",
                         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                         "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                         f"actor_rollout_ref.model.path={no_tokenizer_dir}"], cwd=tmp_path)
    assert result.returncode == 2
    assert f"actor_rollout_ref.model.path: {no_tokenizer_dir} has no tokenizer files" in result.stderr
    assert "Ray" not in result.stdout + result.stderr
    assert_no_traceback(result)


def test_main_generation_refuses_it_before_ray(no_tokenizer_dir, arithmetic_data_dir):
    import ray

    from verlx.config.generation import GenerationConfig
    from verlx.trainer.main_generation import run_generation

    cfg = GenerationConfig()
    cfg.data.path, cfg.model.path = f"{arithmetic_data_dir}/test.parquet", no_tokenizer_dir
    cfg.trainer.device, cfg.trainer.n_gpus_per_node, cfg.rollout.name = "cpu", 1, "hf"
    with pytest.raises(ConfigError, match=f"model.path: {no_tokenizer_dir} has no tokenizer files .*; set "
                       "model.tokenizer_path to a directory that has them"):
        run_generation(cfg)
    assert not ray.is_initialized()


def test_main_sft_refuses_it(no_tokenizer_dir, arithmetic_data_dir, tmp_path):
    result = run_module([f"model.partial_pretrain={no_tokenizer_dir}",
                         f"data.train_files={arithmetic_data_dir}/train.parquet",
                         "data.val_files=null", "trainer.target_val_accuracy=null", "trainer.device=cpu",
                         f"trainer.default_local_dir={tmp_path}/out"],
                        module="verlx.trainer.main_sft", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert (f"model.partial_pretrain: {no_tokenizer_dir} has no tokenizer files (expected tokenizer.json"
            in result.stderr)
    assert f"copy the base model's tokenizer files into {no_tokenizer_dir}" in result.stderr
    assert_no_traceback(result)
