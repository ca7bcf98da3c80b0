#!/usr/bin/env bash
# GRPO with verlx's own rollout engine: no SGLang/vLLM needed, runs with whatever torch the trainer has.
set -euo pipefail
ENGINE=native bash "$(dirname "$0")/run_qwen2.5-0.5b_grpo.sh" trainer.experiment_name=qwen2.5_0.5b_grpo_native "$@"
