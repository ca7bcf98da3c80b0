"""End to end through Ray with 2 CPU workers: one GRPO step and one PPO (GAE + critic) step via main_ppo."""

from __future__ import annotations

import pytest

from helpers.e2e import make_config, read_metrics
from verlx.trainer.main_ppo import run_ppo


@pytest.mark.parametrize(
    "overrides,expect",
    [
        (["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true",
          "trainer.test_freq=1", "actor_rollout_ref.rollout.val_kwargs.n=2",
          "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
          "actor_rollout_ref.rollout.val_kwargs.temperature=1.0"],
         ["actor/kl_loss", "actor/pg_loss", "val-core/arithmetic/reward/mean@2",
          "val-aux/arithmetic/reward/best@2/mean"]),
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


@pytest.mark.parametrize("engine,tolerance", [("hf", 1e-5), ("native", 1e-4)])
def test_grpo_two_steps_engine_follows_actor(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path, engine, tolerance):
    """Step 1: the reference equals the actor (KL exactly 0). The entropy bonus then moves the weights, so in step 2
    the KL to the reference is positive while the engine, refreshed by update_weights, still matches the actor."""
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true",
                      "actor_rollout_ref.actor.entropy_coeff=0.01", "trainer.total_training_steps=2",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=8",  # one optimizer step per training step
                      f"actor_rollout_ref.rollout.name={engine}")
    run_ppo(cfg)
    step1, step2 = read_metrics(tmp_path)
    assert step1["actor/kl_loss"] == 0.0 and step1["actor/grad_norm"] > 0
    assert step2["actor/kl_loss"] > 0
    assert step2["rollout/logprob_diff"] < tolerance and step2["rollout/logprob_diff_max"] < 10 * tolerance
