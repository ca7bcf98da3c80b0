"""The PPO driver across a simulated 2-node cluster (two raylets on this machine): one worker per node."""

from __future__ import annotations

import pytest

from helpers.e2e import make_config, read_metrics
from verlx.trainer.main_ppo import prepare
from verlx.trainer.ppo_trainer import RayPPOTrainer


@pytest.fixture(scope="module")
def two_nodes():
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def test_grpo_step_with_workers_on_two_nodes(two_nodes, tiny_model_dir, arithmetic_data_dir, tmp_path):
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
                      f"ray_kwargs.ray_init.address={two_nodes.address}")
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
