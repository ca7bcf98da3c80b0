#!/usr/bin/env bash
# GRPO on GSM8K with tools (calculator, python sandbox, check_answer) and multi-turn rollouts; docs/multi_turn.md.
# Data: python examples/data_preprocess/gsm8k_tool.py --local_save_dir $HOME/data/gsm8k_tool
# ENGINE=native (default), sglang or vllm; hf cannot run agent loops.
set -euo pipefail
REPO="$(cd "$(dirname "$0")/../.." && pwd)"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"  # the tool file names examples.multi_turn.gsm8k_tools
ENGINE=${ENGINE:-native}
python3 -m verlx.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files=$HOME/data/gsm8k_tool/train.parquet \
    data.val_files=$HOME/data/gsm8k_tool/test.parquet \
    data.train_batch_size=128 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path=$HOME/models/Qwen2.5-0.5B-Instruct \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.001 \
    actor_rollout_ref.rollout.name=$ENGINE \
    actor_rollout_ref.rollout.n=5 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.5 \
    actor_rollout_ref.rollout.multi_turn.enable=True \
    actor_rollout_ref.rollout.multi_turn.tool_config_path=$REPO/examples/multi_turn/gsm8k_tools.yaml \
    actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5 \
    actor_rollout_ref.rollout.multi_turn.max_parallel_calls=2 \
    actor_rollout_ref.rollout.multi_turn.format=hermes \
    trainer.logger='["console","file"]' \
    trainer.project_name=verlx_gsm8k_tool \
    trainer.experiment_name=qwen2.5_0.5b_gsm8k_tool_$ENGINE \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=5 "$@"
