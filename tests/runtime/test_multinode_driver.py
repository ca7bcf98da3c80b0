"""The PPO driver across a simulated 2-node cluster (two raylets on this machine): one worker per node."""

from __future__ import annotations

from helpers.e2e import make_config, read_metrics
from verlx.trainer.main_ppo import prepare
from verlx.trainer.ppo_trainer import RayPPOTrainer


def test_grpo_step_with_workers_on_two_nodes(two_node_cluster, tiny_model_dir, arithmetic_data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
                      f"ray_kwargs.ray_init.address={two_node_cluster.address}")
    use_gpu, tokenizer, train_loader, val_loader, reward = prepare(cfg)
    trainer = RayPPOTrainer(cfg, tokenizer, train_loader, val_loader, reward, reward, use_gpu)
    try:
        trainer.init_workers()
        nodes = [ident.node_id for ident in trainer.worker_group.identities]
        assert len(nodes) == 2 and nodes[0] != nodes[1]
        trainer.fit()
    finally:
        trainer.shutdown()
        reward.close()
    (row,) = read_metrics(tmp_path)
    assert row["step"] == 1 and "actor/pg_loss" in row
