#!/usr/bin/env bash
# GRPO on GSM8K with Qwen2-7B-Instruct on one node of 8 GPUs: the actor and the reference sharded over the 8 ranks
# with FSDP2, the rollout engine in tensor-parallel pairs (4 replicas). Micro-batches, token budgets and activation
# checkpointing are left to the workers (they size them from the free memory at start).
set -euo pipefail
ENGINE=${ENGINE:-vllm}
DATA=${DATA:-$HOME/data/gsm8k}
MODEL=${MODEL:-$HOME/models/Qwen2-7B-Instruct}
python3 -m verlx.trainer.main_ppo \
    data.train_files=$DATA/train.parquet \
    data.val_files=$DATA/test.parquet \
    data.train_batch_size=512 \
    data.max_prompt_length=512 \
    data.max_response_length=1024 \
    actor_rollout_ref.model.path=$MODEL \
    algorithm.adv_estimator=grpo \
    actor_rollout_ref.rollout.name=$ENGINE \
    actor_rollout_ref.rollout.n=8 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.actor.ppo_mini_batch_size=128 \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.use_kl_loss=true \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.ref.fsdp_config.param_offload=true \
    trainer.n_gpus_per_node=8 \
    trainer.logger='[console,file]' \
    trainer.project_name=verlx_gsm8k \
    trainer.experiment_name=qwen2_7b_grpo_8gpu \
    trainer.test_freq=10 \
    trainer.save_freq=50 \
    trainer.total_epochs=10 "$@"
