#!/usr/bin/env bash
# GRPO with vLLM inside each worker (pip install 'verlx[vllm]').
set -euo pipefail
ENGINE=vllm bash "$(dirname "$0")/run_qwen2.5-0.5b_grpo.sh" trainer.experiment_name=qwen2.5_0.5b_grpo_vllm "$@"
