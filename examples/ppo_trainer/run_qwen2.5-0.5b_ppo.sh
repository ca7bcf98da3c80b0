#!/usr/bin/env bash
# PPO (GAE with a critic) on GSM8K with Qwen2.5-0.5B-Instruct on one GPU: veRL's quick-start run without its
# micro-batch sizes (verlx sizes token-budget micro-batches from the GPU's memory; setting them keeps fixed ones).
# Data: python examples/data_preprocess/gsm8k.py --local_save_dir $HOME/data/gsm8k
set -euo pipefail
python3 -m verlx.trainer.main_ppo \
    data.train_files=$HOME/data/gsm8k/train.parquet \
    data.val_files=$HOME/data/gsm8k/test.parquet \
    data.train_batch_size=256 \
    data.max_prompt_length=512 \
    data.max_response_length=512 \
    actor_rollout_ref.model.path=$HOME/models/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=64 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    critic.optim.lr=1e-5 \
    critic.model.path=$HOME/models/Qwen2.5-0.5B-Instruct \
    algorithm.kl_ctrl.kl_coef=0.001 \
    trainer.logger='["console","file"]' \
    trainer.val_before_train=False \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=10 \
    trainer.test_freq=10 \
    trainer.total_epochs=15 "$@"
