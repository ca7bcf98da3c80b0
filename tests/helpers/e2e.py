"""Building small end-to-end configs and reading their metrics (shared by the e2e tests)."""

from __future__ import annotations

import json
import os

from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig


def e2e_overrides(model_dir, data_dir, out_dir, *overrides) -> list[str]:
    """The command-line overrides of a small end-to-end run (2 CPU workers, hf engine, one step)."""
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
    return [*base, *overrides]


def make_config(model_dir, data_dir, out_dir, *overrides) -> PPOConfig:
    overrides = e2e_overrides(model_dir, data_dir, out_dir, *overrides)
    return build(PPOConfig, to_container(load_yaml(overrides=overrides)))


def read_metrics(out_dir) -> list[dict]:
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f]
