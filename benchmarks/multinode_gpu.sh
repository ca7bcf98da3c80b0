#!/usr/bin/env bash
# A real two-node Ray cluster on one 2-GPU host, started as users start one (docs/multinode.md): a head node owning
# GPU 0 and a worker node owning GPU 1, each its own raylet. Then, joining it through RAY_ADDRESS:
#   1. colocated GRPO with trainer.nnodes=2 (one FSDP rank and one engine per node; FSDP's collectives cross the
#      nodes over NCCL), 2 steps with a checkpoint, then a second run that resumes it to step 3;
#   2. one_step_off with the trainer on one node and the rollout group on the other (weights broadcast over NCCL).
# Prints where every rank landed and a summary; a failed run is recorded and the next one still runs.
#
#   source .device/install.sh && bash benchmarks/multinode_gpu.sh          # on the GPU machine (under 10 min: each
#                                                                          # run is cut at RUN_TIMEOUT=180 s)
#   SMOKE=1 OUT=/tmp/o WORK=/tmp/w bash benchmarks/multinode_gpu.sh        # CPU: tiny shape, hf engine
#   NODE_GPUS="2 3" bash benchmarks/multinode_gpu.sh                      # the nodes' GPUs (default "0 1"), to run
#                                                                          # beside other work on a larger host
#
# Every process uses Ray's token authentication (Ray 2.60 turns it on for `ray start` clusters; all processes of
# this host share ~/.ray/auth_token). Each node is a `ray start --block` in a session of its own, so the end of the
# script stops exactly these processes (not `ray stop`, which stops every Ray of the user on the host).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/multinode_out}
WORK=${WORK:-/tmp/multinode}
PORT=${PORT:-6390}
read -r GPU_A GPU_B <<< "${NODE_GPUS:-0 1}"
RAY=(python3 -m ray.scripts.scripts)
export RAY_AUTH_MODE=token PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
declare -A RESULT
PIDS=()
if [ "${SMOKE:-0}" = 1 ]; then  # CPU: one CPU per node forces one worker per node; the tiny shape, hf engine
  GPUS=0 CPUS=1 SHAPE=tiny TOKENS=8 PROMPTS=4 N=2 BACKEND=(trainer.device=cpu actor_rollout_ref.rollout.name=hf)
else
  GPUS=1 CPUS=8 SHAPE=0.5b TOKENS=64 PROMPTS=16 N=4 BACKEND=(actor_rollout_ref.rollout.name=native)
fi

node() {  # node NAME GPU RAY-START-ARGS...: one raylet (`ray start --block`) in a session of its own
  local name=$1 gpu=$2; shift 2
  CUDA_VISIBLE_DEVICES=$gpu setsid "${RAY[@]}" start --block --num-cpus="$CPUS" --num-gpus="$GPUS" \
    --disable-usage-stats "$@" > "$OUT/ray_$name.log" 2>&1 &
  PIDS+=($!)
}

start_cluster() {  # the head owns GPU_A, the worker node GPU_B (as `ray start --head` / `--address` on two hosts)
  node head "$GPU_A" --head --port="$PORT" --include-dashboard=false --temp-dir=/tmp/vxr --resources='{"node_a": 1}'
  sleep 5
  node worker "$GPU_B" --address="127.0.0.1:$PORT" --resources='{"node_b": 1}'
  for _ in $(seq 60); do
    python3 -c "import ray, sys; ray.init(address='127.0.0.1:$PORT', logging_level='ERROR'); \
sys.exit(sum(n['Alive'] for n in ray.nodes()) < 2)" 2>/dev/null && break
    sleep 2
  done
  "${RAY[@]}" status --address="127.0.0.1:$PORT" | grep -E "node_|GPU|CPU" | head -8
}

stop_cluster() {  # exactly the processes of the two nodes: their sessions
  for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
  wait 2>/dev/null
}

inputs() {
  [ -d "$WORK/model" ] || python3 -c "import sys; sys.path.insert(0, 'benchmarks'); from grpo_step_gpu import \
prepare_inputs; prepare_inputs('$WORK', '$SHAPE')" > "$OUT/inputs.log" 2>&1
}

ppo() {  # ppo NAME KEY=VALUE... : one main_ppo run joining the cluster; its log in $OUT/NAME.log
  local name=$1; shift
  RAY_ADDRESS="127.0.0.1:$PORT" timeout "${RUN_TIMEOUT:-180}" python3 -m verlx.trainer.main_ppo \
    algorithm.adv_estimator=grpo data.train_files="$WORK/data/train.parquet" data.val_files="$WORK/data/test.parquet" \
    data.train_batch_size="$PROMPTS" data.max_prompt_length=64 data.max_response_length="$TOKENS" \
    actor_rollout_ref.model.path="$WORK/model" actor_rollout_ref.actor.optim.lr=1e-6 "${BACKEND[@]}" \
    actor_rollout_ref.actor.ppo_mini_batch_size="$PROMPTS" actor_rollout_ref.rollout.n="$N" \
    actor_rollout_ref.rollout.ignore_eos=true actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    trainer.val_before_train=false trainer.logger='[console,file]' trainer.progress_bar=false reward.num_workers=0 \
    trainer.compile_cache_dir="$WORK/compile_cache" trainer.output_dir="$WORK/$name" \
    trainer.default_local_dir="$WORK/${name%_resume}_ckpt" "$@" > "$OUT/$name.log" 2>&1
  local rc=$?
  RESULT[$name]=$rc
  echo "== $name: exit $rc"
  grep -E "joining the Ray cluster|private Ray|trainer workers|rollout worker group|resumed from|died during|error" \
    "$OUT/$name.log" | cut -c1-300
}

start_cluster
inputs
ppo colocated trainer.nnodes=2 trainer.n_gpus_per_node=1 trainer.total_training_steps=2 trainer.save_freq=2
ppo colocated_resume trainer.nnodes=2 trainer.n_gpus_per_node=1 trainer.total_training_steps=3 trainer.save_freq=2
ppo one_step_off actor_rollout_ref.hybrid_engine=false trainer.rollout_mode=one_step_off trainer.nnodes=1 \
  trainer.n_gpus_per_node=1 rollout.nnodes=1 rollout.n_gpus_per_node=1 trainer.total_training_steps=3
stop_cluster

echo
echo "| run | exit | steps logged | mean step s (after the first) | weight_sync s (all steps) |"
echo "|---|---|---|---|---|"
for name in colocated colocated_resume one_step_off; do
  metrics="$WORK/$name/metrics.jsonl"
  python3 - "$name" "${RESULT[$name]:-?}" "$metrics" <<'EOF'
import json, os, sys
name, rc, path = sys.argv[1:]
rows = [json.loads(line) for line in open(path)] if os.path.exists(path) else []
later = rows[1:] or rows
mean = lambda key: sum(r.get(key, 0.0) for r in later) / len(later) if later else float("nan")
synced = sum(r.get("timing_s/weight_sync", 0.0) for r in rows)  # few syncs, mostly in step 1: summed, not averaged
print(f"| {name} | {rc} | {[r['step'] for r in rows]} | {mean('timing_s/step'):.2f} | {synced:.3f} |")
EOF
done
for name in colocated colocated_resume one_step_off; do  # the script fails when a run did
  [ "${RESULT[$name]:-1}" = 0 ] || exit 1
done
