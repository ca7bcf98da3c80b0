"""End to end through Ray with 2 CPU workers: one GRPO step and one PPO (GAE + critic) step via main_ppo."""

from __future__ import annotations

import json
import os

import pytest

from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer.main_ppo import run_ppo


def make_config(model_dir, data_dir, out_dir, *overrides) -> PPOConfig:
    base = [
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        "data.train_batch_size=8", "data.max_prompt_length=32", "data.max_response_length=8",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8", "critic.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.name=hf", "trainer.n_gpus_per_node=2", "trainer.total_training_steps=1",
        "trainer.logger=[file]", "trainer.progress_bar=false", f"trainer.output_dir={out_dir}",
        f"trainer.default_local_dir={out_dir}/ckpt", "trainer.val_before_train=false", "reward.num_workers=0",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
    ]
    return build(PPOConfig, to_container(load_yaml(overrides=[*base, *overrides])))


def read_metrics(out_dir) -> list[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true"],
         ["actor/kl_loss", "actor/pg_loss"]),
        (["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true"],
         ["critic/vf_loss", "critic/values/mean", "actor/reward_kl_penalty"]),
    ],
    ids=["grpo", "ppo-gae-critic"],
)
def test_one_step_end_to_end(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path, overrides, expect):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *overrides)
    final = run_ppo(cfg)
    assert final["training/global_step"] == 1
    rows = read_metrics(tmp_path)
    assert rows[-1]["step"] == 1
    for key in expect + ["critic/score/mean", "response_length/mean", "timing_s/gen", "perf/throughput",
                         "rollout/logprob_diff", "actor/entropy", "actor/grad_norm"]:
        assert key in rows[-1], key
    # the hf engine and the FSDP actor hold the same fp32 weights: their log-probs of the sampled tokens agree
    assert rows[-1]["rollout/logprob_diff"] < 1e-5


def test_grpo_two_steps_engine_follows_actor(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """Step 1: the reference equals the actor (KL exactly 0). The entropy bonus then moves the weights, so in step 2
    the KL to the reference is positive while the engine, refreshed by update_weights, still matches the actor."""
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true",
                      "actor_rollout_ref.actor.entropy_coeff=0.01", "trainer.total_training_steps=2",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=8")  # one optimizer step per training step
    run_ppo(cfg)
    step1, step2 = read_metrics(tmp_path)
    assert step1["actor/kl_loss"] == 0.0 and step1["actor/grad_norm"] > 0
    assert step2["actor/kl_loss"] > 0
    assert step2["rollout/logprob_diff"] < 1e-5
