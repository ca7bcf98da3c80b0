"""Workers fill the keys a config leaves null (token budgets, dynamic batches, gradient checkpointing) when they
start, report each choice with its reason (the driver logs rank 0's once), and train with them; explicit values are
kept."""

from __future__ import annotations

import logging

from helpers.e2e import make_config
from helpers.ppo_batches import ragged_ppo_batch
from verlx.trainer.ppo_trainer import log_worker_settings
from verlx.workers import micro_batching

NO_MICRO_SIZES = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null",
                  "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null",
                  "critic.ppo_micro_batch_size_per_gpu=null",
                  "actor_rollout_ref.model.enable_gradient_checkpointing=null"]


def test_workers_decide_log_once_and_train_with_token_budgets(one_rank, tiny_model_dir, tmp_path, caplog,
                                                              monkeypatch):
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
    from verlx.workers.critic_worker import CriticWorker

    for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):  # restored after the test
        monkeypatch.delenv(var, raising=False)
    cfg = make_config(tiny_model_dir, tmp_path, tmp_path, "trainer.n_gpus_per_node=1", "algorithm.adv_estimator=gae",
                      "actor_rollout_ref.actor.use_kl_loss=true", f"trainer.compile_cache_dir={tmp_path}/cache",
                      *NO_MICRO_SIZES)
    critic = CriticWorker(cfg)
    critic_settings = critic.init_model()["settings"]
    actor = ActorRolloutRefWorker(cfg, role="actor_ref")
    actor_settings = actor.init_model()["settings"]
    arr = actor.config.actor_rollout_ref
    assert (arr.actor.use_dynamic_bsz, arr.rollout.log_prob_use_dynamic_bsz, arr.ref.log_prob_use_dynamic_bsz) == (
        True, True, True)
    assert arr.actor.ppo_max_token_len_per_gpu == 16_384  # the CPU constant
    assert arr.ref.log_prob_max_token_len_per_gpu == arr.rollout.log_prob_max_token_len_per_gpu == 16_384
    assert arr.model.enable_gradient_checkpointing is False
    assert critic.config.critic.use_dynamic_bsz is True
    assert critic.config.critic.forward_max_token_len_per_gpu == 16_384
    assert cfg.actor_rollout_ref.actor.ppo_max_token_len_per_gpu is None  # the driver's config is untouched
    cache = tmp_path / "cache"
    assert actor_settings[0] == critic_settings[0] == (
        f"compile caches (trainer.compile_cache_dir): inductor {cache}/inductor, Triton {cache}/triton")
    assert "actor_rollout_ref.actor.use_dynamic_bsz auto → true (no micro-batch size set)" in actor_settings
    assert "critic.use_dynamic_bsz auto → true" in critic_settings
    # the driver logs rank 0's choices once per worker group
    with caplog.at_level(logging.INFO):
        log_worker_settings("actor", [{"settings": actor_settings}, {"settings": actor_settings}])
    assert [r.getMessage() for r in caplog.records] == ["actor: " + "; ".join(actor_settings)]

    budgets = []
    real = micro_batching.token_budget_micro_batches
    monkeypatch.setattr(micro_batching, "token_budget_micro_batches",
                        lambda data, budget, *a, **k: budgets.append(budget) or real(data, budget, *a, **k))
    data = ragged_ppo_batch(0, rows=8, critic=True)
    actor.compute_log_prob(data)
    data.batch["ref_log_prob"] = actor.compute_ref_log_prob(data).batch["ref_log_prob"]
    metrics = actor.update_actor(data).meta_info["metrics"]
    critic.update_critic(data)
    # old and reference log-probs, then 2 mini-batches (4 prompts of the 8 rows) for the actor and for the critic
    assert budgets == [16_384] * 6
    assert metrics["actor/grad_norm"] > 0
