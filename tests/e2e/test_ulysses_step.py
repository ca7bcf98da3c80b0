"""Ulysses through the whole trainer on 2 CPU workers: one PPO step with actor and critic at SP=2 (one data shard
on both ranks) matches the same step at SP=1 (two shards), and the SP actor's log-probs match the rollout's; with
token-budget micro-batches, veRL's per-GPU budgets (half the longest sequence at SP=2) run as in veRL."""

from __future__ import annotations

import pytest

from helpers.e2e import make_config, read_metrics
from verlx.trainer.main_ppo import run_ppo

# one optimizer step over all 8 samples, so both layouts average the same gradient
COMMON = ["algorithm.adv_estimator=gae", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
          "critic.ppo_mini_batch_size=8", "actor_rollout_ref.actor.entropy_coeff=0.01"]


# a score that varies with the sampled text, so returns, value loss and critic gradients are not all zero
REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n" \
         "    return (len(solution_str) % 5) / 4.0\n"


def _run(tmp_path, tiny_model_dir, arithmetic_data_dir, sp: int, *extra: str) -> dict:
    out = tmp_path / f"sp{sp}{'_' if extra else ''}{len(extra)}"
    reward = tmp_path / "length_reward.py"
    reward.write_text(REWARD)
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, out, *COMMON, f"custom_reward_function.path={reward}",
                      f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={sp}",
                      f"critic.ulysses_sequence_parallel_size={sp}", *extra)
    run_ppo(cfg)
    return read_metrics(out)[-1]


def test_sp2_step_matches_sp1(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    sp1 = _run(tmp_path, tiny_model_dir, arithmetic_data_dir, 1)
    sp2 = _run(tmp_path, tiny_model_dir, arithmetic_data_dir, 2)
    assert sp2["rollout/logprob_diff"] < 1e-5  # the hf engine and the sequence-parallel actor agree
    assert sp2["critic/score/mean"] == sp1["critic/score/mean"]  # same rollouts
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/entropy", "critic/grad_norm", "critic/vf_loss"):
        assert sp2[key] == pytest.approx(sp1[key], rel=1e-4, abs=1e-7), key
    assert sp1["actor/grad_norm"] > 0 and sp1["critic/grad_norm"] > 0 and sp1["critic/vf_loss"] > 0


BUDGET_KEYS = ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
               "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu",
               "critic.forward_max_token_len_per_gpu")


def test_sp2_step_with_verls_per_gpu_budgets_matches_sp1(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    """Prompts of up to 32 and responses of up to 8 tokens: 40 per sequence. Every budget (actor, old and reference
    log-probs, critic update and values) at 20 tokens per GPU: each of the two Ulysses GPUs holds half of a 40-token
    micro-batch (the preflight refuses 20 at SP=1, and would refuse 19 here)."""
    dynamic = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.use_kl_loss=true"]
    sp1 = _run(tmp_path, tiny_model_dir, arithmetic_data_dir, 1, *dynamic, *[f"{k}=40" for k in BUDGET_KEYS])
    sp2 = _run(tmp_path, tiny_model_dir, arithmetic_data_dir, 2, *dynamic, *[f"{k}=20" for k in BUDGET_KEYS])
    assert sp2["rollout/logprob_diff"] < 1e-5
    assert sp2["critic/score/mean"] == sp1["critic/score/mean"]
    for key in ("actor/grad_norm", "actor/pg_loss", "actor/kl_loss", "critic/grad_norm", "critic/vf_loss"):
        assert sp2[key] == pytest.approx(sp1[key], rel=1e-4, abs=1e-7), key
    assert sp1["actor/grad_norm"] > 0 and sp1["critic/vf_loss"] > 0
