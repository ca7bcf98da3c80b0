"""Every advantage estimator runs one CPU step through main_ppo, and DAPO dynamic sampling fills its batch."""

from __future__ import annotations

import math

import pytest

from helpers.e2e import make_config, read_metrics
from helpers.registries import shipped_names
from verlx.algorithms.advantages import ADV_ESTIMATORS
from verlx.config.loader import ConfigError
from verlx.trainer.main_ppo import run_ppo

ESTIMATORS = ["gae", "grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax",
              "opo", "gpg", "gdpo", "optimal_token_baseline", "tir_optimal_token_baseline"]
# gdpo reads reward components: a reward function returning two that vary with the sampled text
COMPONENT_REWARD = ("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                    "    fmt, length = float('=' in solution_str), (len(solution_str) % 5) / 4.0\n"
                    "    return {'score': fmt + length, 'fmt': fmt, 'length': length}\n")


def test_every_registered_estimator_is_covered():
    """Every estimator verlx ships; test helpers register planted faults too (tests/helpers/learning_faults.py)."""
    assert sorted(ESTIMATORS) == shipped_names(ADV_ESTIMATORS, lambda estimator: estimator.fn)


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_estimator_step(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path, estimator):
    extra = []
    if estimator == "gdpo":
        (tmp_path / "components.py").write_text(COMPONENT_REWARD)
        extra = [f"custom_reward_function.path={tmp_path / 'components.py'}", "algorithm.gdpo_reward_keys=[fmt,length]",
                 "algorithm.gdpo_reward_weights=[1.0,0.5]"]
    if estimator == "optimal_token_baseline":  # decoupled rollout IS: its weights reach the estimator and the actor
        extra = ["algorithm.rollout_correction.rollout_is=token"]
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, f"algorithm.adv_estimator={estimator}",
                      "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
                      "actor_rollout_ref.actor.entropy_coeff=0.01", *extra)
    run_ppo(cfg)
    (row,) = read_metrics(tmp_path)
    for key in ("critic/advantages/mean", "critic/returns/mean", "actor/pg_loss", "actor/grad_norm"):
        assert math.isfinite(row[key]), key
    assert row["actor/grad_norm"] > 0  # the entropy bonus alone moves the weights
    if estimator == "remax":
        assert "timing_s/gen_max" in row  # the extra greedy pass ran
    if estimator == "gae":
        assert "critic/vf_loss" in row
    if estimator == "optimal_token_baseline":
        assert "rollout_corr/rollout_is_mean" in row and "timing_s/old_log_prob" in row


def test_grpo_with_gspo_and_token_sum_norm(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
                      "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                      "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                      "actor_rollout_ref.actor.clip_ratio_low=0.2", "actor_rollout_ref.actor.clip_ratio_high=0.28")
    run_ppo(cfg)
    (row,) = read_metrics(tmp_path)
    assert math.isfinite(row["actor/pg_loss"])


@pytest.mark.parametrize("loss_type", ["ppo_clip", "reinforce"])
def test_bypass_mode_skips_the_old_log_prob_pass(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path, loss_type):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
                      "actor_rollout_ref.actor.entropy_coeff=0.01", "algorithm.rollout_correction.bypass_mode=true",
                      f"algorithm.rollout_correction.loss_type={loss_type}",
                      "algorithm.rollout_correction.rollout_is=token")
    run_ppo(cfg)
    (row,) = read_metrics(tmp_path)
    assert "timing_s/old_log_prob" not in row and "actor/entropy" not in row  # the actor forward did not run
    assert "actor/on_policy_log_prob_diff_max" not in row  # old_log_probs are the engine's: nothing to probe
    # the correction ran in the actor's loss (current policy vs engine); the hf engine and the actor hold the same
    # fp32 weights and the first mini-batch runs before any step, so the weights average close to 1
    assert math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0
    assert abs(row["rollout_corr/rollout_is_mean"] - 1) < 0.1 and "rollout_corr/kl" in row


def test_new_losses_token_sum_and_straight_through_kl(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
                      "actor_rollout_ref.actor.policy_loss.loss_mode=dppo_kl",
                      "actor_rollout_ref.actor.loss_agg_mode=token-sum", "actor_rollout_ref.actor.use_kl_loss=true",
                      "actor_rollout_ref.actor.kl_loss_type=k3+", "actor_rollout_ref.actor.entropy_coeff=0.01",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=8")  # one optimizer step: actor == reference
    run_ppo(cfg)
    (row,) = read_metrics(tmp_path)
    assert math.isfinite(row["actor/pg_loss"]) and row["actor/grad_norm"] > 0 and row["actor/kl_loss"] == 0.0


def test_dynamic_sampling_gives_up_with_the_numbers(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    # a random model never answers correctly: every group scores all zeros and is dropped
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1",
                      "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=2")
    with pytest.raises(RuntimeError, match=r"after 2 generation batches only 0 of 16 samples"):
        run_ppo(cfg)


def test_grpo_with_one_sample_warns(tiny_model_dir, arithmetic_data_dir, tmp_path, caplog):
    from verlx.trainer.preflight import validate

    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo")
    warnings = validate(cfg)
    assert any("every advantage is 0" in w for w in warnings)


def test_remax_needs_greedy_decoding(tiny_model_dir, arithmetic_data_dir, tmp_path, monkeypatch):
    from verlx.rollout.hf_engine import HFEngine
    from verlx.trainer.main_ppo import check_engine_capabilities

    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=remax")
    monkeypatch.setattr(HFEngine, "supports_greedy", False)
    with pytest.raises(ConfigError, match=r"adv_estimator=remax \(a greedy baseline\) needs a rollout engine that "
                                          r"decodes greedily, but actor_rollout_ref.rollout.name=hf cannot"):
        check_engine_capabilities(cfg, "hf")


@pytest.mark.parametrize("where", ["loss", "reward"])
def test_exact_full_vocabulary_kl(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path, where):
    """kl 'full': in the loss the first optimizer step sees KL 0 (actor == reference); in the reward likewise."""
    extra = (["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=full",
              "actor_rollout_ref.actor.ppo_mini_batch_size=8"] if where == "loss" else
             ["algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full"])
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "trainer.n_gpus_per_node=1", *extra)
    run_ppo(cfg)
    (row,) = read_metrics(tmp_path)
    key = "actor/kl_loss" if where == "loss" else "actor/reward_kl_penalty"
    assert abs(row[key]) < 1e-6
