#!/usr/bin/env bash
# GRPO with LoRA on the actor (rank 32): the reference is the actor with adapters disabled (no second model),
# rollout engines receive merged weights. Optimizer state is only the adapters'.
set -euo pipefail
bash "$(dirname "$0")/run_qwen2.5-0.5b_grpo.sh" \
    actor_rollout_ref.model.lora_rank=32 \
    actor_rollout_ref.model.lora_alpha=32 \
    actor_rollout_ref.model.target_modules=all-linear \
    actor_rollout_ref.actor.optim.lr=3e-5 \
    trainer.experiment_name=qwen2.5_0.5b_grpo_lora "$@"
