#!/usr/bin/env bash
# GRPO with SGLang inside each worker (pip install 'verlx[sglang]').
set -euo pipefail
ENGINE=sglang bash "$(dirname "$0")/run_qwen2.5-0.5b_grpo.sh" trainer.experiment_name=qwen2.5_0.5b_grpo_sglang "$@"
