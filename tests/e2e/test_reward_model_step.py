"""One GRPO step through main_ppo on 2 CPU workers with veRL's keys for a model-based reward model, DAPO dynamic
sampling over gen_batch_size prompts and the profiler: the reward is the reward model's score, rounds of
gen_batch_size prompts are trimmed to train_batch_size, and the asked phases are traced on the asked rank only."""

from __future__ import annotations

import json
import os

import pytest

from helpers.e2e import make_config, read_metrics
from verlx.trainer.main_ppo import run_ppo


def test_grpo_step_with_a_reward_model_dynamic_sampling_and_profiles(ray_cpu, tiny_model_dir, tiny_reward_model_dir,
                                                                     arithmetic_data_dir, tmp_path):
    profiles, dumps = tmp_path / "profiles", tmp_path / "rollouts"
    cfg = make_config(
        tiny_model_dir, arithmetic_data_dir, tmp_path,
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2",
        "reward_model.enable=true", f"reward_model.model.path={tiny_reward_model_dir}",
        "reward_model.micro_batch_size_per_gpu=4",
        "algorithm.filter_groups.enable=true", "+data.gen_batch_size=16",  # veRL scripts add the key with '+'
        f"trainer.rollout_data_dir={dumps}", "trainer.test_freq=1",  # validation scores with the reward model too
        "global_profiler.tool=torch", "global_profiler.steps=[1]", f"global_profiler.save_path={profiles}",
        "actor_rollout_ref.actor.profiler.enable=true", "actor_rollout_ref.actor.profiler.ranks=[1]",
        "reward_model.profiler.enable=true", "reward_model.profiler.ranks=[1]")
    assert cfg.data.return_raw_chat is False  # the reward model's re-templating turns it on (said at start)
    final = run_ppo(cfg)
    assert final["training/global_step"] == 1
    (row,) = read_metrics(tmp_path)
    # the reward model's scores are real numbers that differ within every group: one round of 16 prompts is enough,
    # and its groups are trimmed to the 8 prompts of data.train_batch_size
    assert row["batch/num_gen_batches"] == 1.0
    with open(dumps / "1.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert len(records) == 8 * 2
    scores = [r["score"] for r in records]
    assert len(set(scores)) == len(scores) and any(s not in (0.0, 1.0) for s in scores)
    assert row["critic/score/mean"] == pytest.approx(sum(scores) / len(scores), abs=1e-5)
    assert row["val-core/arithmetic/reward/mean@1"] not in (0.0, 1.0)  # a mean of the reward model's scores
    # the reward model runs twice in step 1: the training batch, then validation (its trace gets the suffix _2)
    assert sorted(os.listdir(profiles)) == sorted(
        f"{stem}{suffix}" for stem in ("actor_infer_step1_rank1", "actor_step1_rank1", "reward_model_step1_rank1",
                                       "reward_model_step1_rank1_2") for suffix in (".json", "_summary.json"))
    summary = json.loads((profiles / "reward_model_step1_rank1_summary.json").read_text())
    assert (summary["phase"], summary["step"], summary["rank"]) == ("reward_model", 1, 1)
