"""A LoRA actor colocated with a rollout engine says, once, that the engine gets merged weights (no engine here
loads adapters), in one process on a 1-rank gloo group."""

from __future__ import annotations

import pytest

from helpers.e2e import make_config


@pytest.mark.parametrize("lora_rank", [0, 2])
def test_lora_logs_the_merged_weight_fallback(one_rank, tiny_model_dir, tmp_path, caplog, lora_rank):
    from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker

    cfg = make_config(tiny_model_dir, tmp_path, tmp_path, "trainer.n_gpus_per_node=1", "algorithm.adv_estimator=grpo",
                      f"actor_rollout_ref.model.lora_rank={lora_rank}", "actor_rollout_ref.model.lora_alpha=4")
    with caplog.at_level("INFO", logger="verlx.workers.actor_rollout_ref_worker"):
        ActorRolloutRefWorker(cfg, role="actor_rollout_ref").init_model()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("LoRA:")]
    if lora_rank:
        assert lines == [f"LoRA: the {cfg.actor_rollout_ref.rollout.name} rollout engine receives the actor's weights "
                         "with the adapters merged in at every push (no engine here loads adapters separately)"]
    else:
        assert lines == []
