"""Checks made before Ray starts: value ranges, model files, output directories, the reward columns of the data,
settings that learn nothing; and the non-finite accounting that stops a run whose weights diverged."""

from __future__ import annotations

import json
import logging
import math
import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verlx.config.loader import ConfigError, DataError, build, load_yaml, to_container
from verlx.config.ranges import PPO_RANGES, SFT_RANGES, above, at_least, range_problems, unit_interval
from verlx.config.schema import PPOConfig
from verlx.config.sft import SFTConfig
from verlx.models.weight_files import model_dir_problems, safetensors_problem
from verlx.trainer.invariants import check_finite_log_probs, check_on_policy
from verlx.trainer.output_dirs import prepare_output_dirs
from verlx.trainer.preflight import validate
from verlx.trainer.reward_columns import check_reward_columns
from verlx.workers.guarded_step import NonFiniteUpdates


def ppo(*overrides) -> PPOConfig:
    return build(PPOConfig, to_container(load_yaml(overrides=["trainer.n_gpus_per_node=1", *overrides])))


def refused(*overrides) -> list[str]:
    with pytest.raises(ConfigError) as info:
        validate(ppo(*overrides), check_files=False)
    return info.value.problems


# ---------------------------------------------------------------------------------------------- ranges
def _has_key(config, key: str) -> bool:
    for part in key.split("."):
        if not hasattr(config, part):
            return False
        config = getattr(config, part)
    return True


def test_every_range_names_a_key_of_the_schema():
    assert [k for k in PPO_RANGES if not _has_key(PPOConfig(), k)] == []
    assert [k for k in SFT_RANGES if not _has_key(SFTConfig(), k)] == []


def test_the_defaults_are_in_range():
    assert range_problems(PPOConfig(), PPO_RANGES) == []
    assert range_problems(SFTConfig(), SFT_RANGES) == []


@pytest.mark.parametrize("override, problem", [
    ("actor_rollout_ref.actor.optim.lr=-1e-3",
     "actor_rollout_ref.actor.optim.lr=-0.001 is out of range: it must be >= 0"),
    ("data.max_response_length=0", "data.max_response_length=0 is out of range: it must be >= 1 (tokens each "
                                   "response may have)"),
    ("actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs=0 is out of range: it must be >= 1 "
                                             "(passes over each batch)"),
    ("reward.num_workers=-1", "reward.num_workers=-1 is out of range: it must be >= 0 (0 scores in the driver)"),
    ("reward.timeout_s=0", "reward.timeout_s=0.0 is out of range: it must be > 0 (seconds one sample may take)"),
    ("algorithm.gamma=1.5", "algorithm.gamma=1.5 is out of range: it must be in [0, 1]"),
    ("algorithm.lam=nan", "algorithm.lam=nan must be a finite number"),
    ("reward.error_score=-inf", "reward.error_score=-inf must be a finite number"),
])
def test_a_value_out_of_range_is_refused_naming_the_range(override, problem):
    assert problem in refused(override)


def test_range_notation():
    assert [str(r) for r in (at_least(1), above(0, "null = no limit"), unit_interval())] == [
        ">= 1", "> 0 (null = no limit)", "in [0, 1]"]


# ---------------------------------------------------------------------------------------------- model files
@pytest.fixture
def model_copy(tiny_model_dir, tmp_path):
    return shutil.copytree(tiny_model_dir, tmp_path / "model")


def test_an_intact_model_directory_passes(tiny_model_dir):
    assert model_dir_problems(tiny_model_dir, "actor_rollout_ref.model.path") == []


def test_a_truncated_safetensors_file_is_named(model_copy):
    weights = model_copy / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size - 100])
    assert safetensors_problem(str(weights)) == f"is truncated: {size - 100} bytes, but its header describes {size}"
    (problem,) = model_dir_problems(str(model_copy), "critic.model.path")
    assert problem.startswith(f"critic.model.path: {weights} is truncated: ")
    weights.write_bytes(b"\x07")
    assert safetensors_problem(str(weights)) == "is truncated: 1 bytes, not even the 8-byte header length"


def test_a_shard_missing_from_the_index_and_a_broken_config_are_named(model_copy):
    (model_copy / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}))
    (model_copy / "config.json").write_text('{"hidden_size": 8,')
    problems = model_dir_problems(str(model_copy), "actor_rollout_ref.model.path")
    assert problems[0].startswith(f"actor_rollout_ref.model.path: {model_copy}/config.json is not valid JSON (")
    assert problems[1].startswith(f"actor_rollout_ref.model.path: {model_copy}/model.safetensors.index.json lists 2 "
                                  f"weight files, of which 1 are missing from {model_copy}: "
                                  "model-00002-of-00002.safetensors;")


# ---------------------------------------------------------------------------------------------- output dirs
def test_output_directories_are_created_up_front_or_named(tmp_path):
    prepare_output_dirs(ppo(f"trainer.output_dir={tmp_path}/out", f"trainer.default_local_dir={tmp_path}/ckpt",
                            f"trainer.rollout_data_dir={tmp_path}/dumps"))
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "dumps", "out"] and os.listdir(tmp_path / "ckpt") == []
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError) as info:
        prepare_output_dirs(ppo(f"trainer.output_dir={tmp_path}/file/out", f"trainer.default_local_dir={tmp_path}/k"))
    assert info.value.problems == [f"trainer.output_dir={tmp_path}/file/out: cannot create or write to "
                                   f"{tmp_path}/file/out: {tmp_path}/file is a file, not a directory; choose a "
                                   "directory this user can write to"]


def test_a_server_log_directory_is_checked_only_in_server_mode(tmp_path):
    (tmp_path / "file").write_text("x")
    base = (f"trainer.output_dir={tmp_path}/out", f"trainer.default_local_dir={tmp_path}/ckpt",
            f"actor_rollout_ref.rollout.server.log_dir={tmp_path}/file/logs")
    prepare_output_dirs(ppo(*base))  # in-process engines write no server log
    with pytest.raises(ConfigError) as info:
        prepare_output_dirs(ppo(*base, "actor_rollout_ref.rollout.server.enable=true"))
    assert info.value.problems == [f"actor_rollout_ref.rollout.server.log_dir={tmp_path}/file/logs: cannot create or "
                                   f"write to {tmp_path}/file/logs: {tmp_path}/file is a file, not a directory; "
                                   "choose a directory this user can write to"]


# ---------------------------------------------------------------------------------------------- reward columns
def test_rows_the_built_in_scores_cannot_score_are_named_by_file_and_row(arithmetic_data_dir, tmp_path):
    from helpers.tiny_tokenizer import build_tiny_tokenizer
    from verlx.data.rl_dataset import RLHFDataset

    rows = pq.read_table(f"{arithmetic_data_dir}/train.parquet").to_pylist()[:8]
    rows[3]["reward_model"] = {"style": "rule", "ground_truth": None}
    rows[6]["reward_model"] = {"style": "rule", "ground_truth": None}
    rows[5]["data_source"] = "my_task"
    path = str(tmp_path / "train.parquet")
    pq.write_table(pa.Table.from_pylist(rows), path)
    config = ppo(f"data.train_files={path}", "data.max_prompt_length=64")
    dataset = RLHFDataset(path, build_tiny_tokenizer(), config.data)
    with pytest.raises(DataError) as info:
        check_reward_columns(config, dataset, None)
    text = str(info.value)
    assert text.startswith(f"{path} row 5: data_source='my_task' has no built-in reward score (1 of 8 rows; built-in: ")
    assert f"; {path} row 3: no reward_model.ground_truth, which the built-in score compares responses with (2 of 8 " \
           "rows)" in text
    check_reward_columns(ppo(f"custom_reward_function.path={path}"), dataset, None)  # a custom function decides


# ---------------------------------------------------------------------------------------------- learning nothing
def test_settings_that_learn_nothing_are_warned_about(caplog):
    with caplog.at_level(logging.WARNING):
        warnings = validate(ppo("data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
                                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
                                "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4",
                                "actor_rollout_ref.rollout.temperature=0", "actor_rollout_ref.actor.optim.lr=0",
                                "trainer.total_training_steps=5", "trainer.critic_warmup=5"), check_files=False)
    assert any(w.startswith("actor_rollout_ref.actor.optim.lr=0: the policy never changes") for w in warnings)
    assert any(w.startswith("trainer.critic_warmup=5 >= trainer.total_training_steps=5: the actor is never updated")
               for w in warnings)
    assert any(w.startswith("actor_rollout_ref.rollout.temperature=0 decodes greedily, so the rollout.n=4 responses")
               for w in warnings)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) >= 3


# ---------------------------------------------------------------------------------------------- diverged weights
def test_non_finite_log_probs_stop_the_run_naming_the_learning_rate():
    log_probs = torch.tensor([[-1.0, float("nan"), -2.0], [-0.5, -0.5, float("inf")]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    with pytest.raises(NonFiniteUpdates, match=r"^step 2: 1 of 5 response tokens have a non-finite log-prob under "
                                               r"the weights after this step's update: .*optim\.lr=1e\+06\)"):
        check_finite_log_probs(log_probs, mask, 2, 1e6, when="after")
    check_finite_log_probs(log_probs[:, :1], mask[:, :1], 2, 1e6)  # finite where it counts: nothing raised


def test_a_nan_on_policy_difference_is_left_to_the_non_finite_accounting():
    nan = {"actor/on_policy_log_prob_diff_max": math.nan, "actor/nonfinite_updates_skipped": 1.0}
    check_on_policy(nan, 0.0, 3)  # the skipped update was counted: the guard stops the run if it goes on
    with pytest.raises(Exception, match="the actor's log-probs are not finite"):
        check_on_policy({"actor/on_policy_log_prob_diff_max": math.nan}, 0.0, 3)
