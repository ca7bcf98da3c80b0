"""Step time of GRPO in the rollout modes (docs/async.md) on the same devices: sync with every GPU colocated, then
one_step_off and async with the trainer on --trainer-gpus and the rollout group on --rollout-gpus.

Each mode is one `verlx.trainer.main_ppo` run on a Qwen2.5-0.5B-shaped model (random weights, responses forced to
--response-length so every mode generates the same tokens); the table shows per mode the mean over the steps after
the first of the step time, the generation time, the time the trainer waited for a batch, the weight broadcast,
the staleness, and the run's wall time. $OUT/async_step.json keeps everything.

  python benchmarks/async_step_gpu.py --trainer-gpus 1 --rollout-gpus 1 --steps 6 --prompts 64 --n 8
  python benchmarks/async_step_gpu.py --smoke      # CPU: one_step_off, 1 + 1 worker processes, tiny shape, 2 steps
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from grpo_step_gpu import build_model  # noqa: E402  (the benchmark next to this one)

SHOWN = ("timing_s/step", "timing_s/gen", "async/trainer_wait_s", "timing_s/weight_sync", "timing_s/update_actor",
         "async/staleness/mean", "perf/throughput")


def mode_overrides(mode: str, args) -> list[str]:
    total = args.trainer_gpus + args.rollout_gpus
    if mode == "sync":
        return [f"trainer.n_gpus_per_node={total}"]
    separate = ["actor_rollout_ref.hybrid_engine=false", f"trainer.n_gpus_per_node={args.trainer_gpus}",
                f"rollout.n_gpus_per_node={args.rollout_gpus}", f"trainer.rollout_mode={mode}"]
    return separate + ([f"trainer.max_staleness={args.max_staleness}"] if mode == "async" else [])


def run_mode(mode: str, args, model_dir: str, data_dir: str, work: str) -> dict:
    out_dir = os.path.join(work, mode)
    overrides = [
        "algorithm.adv_estimator=grpo", f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet", f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=64", f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts}", "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
        f"actor_rollout_ref.rollout.name={args.engine}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.ignore_eos=true", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        f"trainer.device={args.device}", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false", "trainer.logger=[file]", f"trainer.output_dir={out_dir}",
        f"trainer.default_local_dir={out_dir}/ckpt", "trainer.progress_bar=false", "reward.num_workers=0",
        "trainer.save_on_signal=false", *mode_overrides(mode, args), *args.extra,
    ]
    start = time.time()
    limit = ["timeout", "-k", "30", str(args.timeout_s)] if args.timeout_s else []  # SIGTERM: a clean stop, no save
    rc = subprocess.run([*limit, sys.executable, "-m", "verlx.trainer.main_ppo", *overrides], cwd=ROOT).returncode
    wall = time.time() - start
    rows = []
    if os.path.exists(os.path.join(out_dir, "metrics.jsonl")):
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            rows = [json.loads(line) for line in f]
    steady = rows[1:] or rows
    means = {k: sum(r.get(k, 0.0) for r in steady) / len(steady) for k in SHOWN} if steady else {}
    return {"rc": rc, "wall_s": wall, "steps": rows, "steady_mean": means,
            "staleness_max": max((r.get("async/staleness/max", 0.0) for r in rows), default=None)}


def write_summary(args, results: dict) -> None:
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "async_step.json"), "w") as f:
            json.dump({"args": vars(args), "modes": results}, f, indent=1)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shape, 2 steps, one_step_off")
    p.add_argument("--shape", default="0.5b")
    p.add_argument("--modes", nargs="+", default=["sync", "one_step_off", "async"])
    p.add_argument("--trainer-gpus", type=int, default=1)
    p.add_argument("--rollout-gpus", type=int, default=1)
    p.add_argument("--max-staleness", type=int, default=2)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--prompts", type=int, default=64, help="data.train_batch_size")
    p.add_argument("--n", type=int, default=8, help="actor_rollout_ref.rollout.n")
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--engine", default="native")
    p.add_argument("--device", default="cuda")
    p.add_argument("--extra", nargs="*", default=[], help="more key=value overrides for every mode")
    p.add_argument("--timeout-s", type=int, default=0, help="each mode's limit (0: none); the next mode still runs")
    args = p.parse_args()
    if args.smoke:
        args.shape, args.modes, args.steps, args.prompts, args.n = "tiny", ["one_step_off"], 2, 2, 2
        args.response_length, args.device, args.trainer_gpus, args.rollout_gpus = 4, "cpu", 1, 1
    work = tempfile.mkdtemp(prefix="verlx-async-")
    model_dir, data_dir = os.path.join(work, "model"), os.path.join(work, "data")
    build_model(model_dir, args.shape)
    subprocess.run([sys.executable, os.path.join(ROOT, "examples/data_preprocess/arithmetic.py"),
                    "--local_save_dir", data_dir, "--test_size", "16"], check=True)
    args.extra = [f"trainer.compile_cache_dir={work}/compile_cache", *args.extra]  # the later modes reuse it
    results = {}
    for mode in args.modes:  # written after each mode: a call cut short keeps the modes that finished
        results[mode] = run_mode(mode, args, model_dir, data_dir, work)
        write_summary(args, results)
    print(f"\n| mode | wall s | {' | '.join(k.split('/', 1)[1] for k in SHOWN)} | max staleness |")
    print("|---" * (len(SHOWN) + 3) + "|")
    for mode, result in results.items():
        cells = [f"{result['steady_mean'].get(k, float('nan')):.3g}" for k in SHOWN]
        print(f"| {mode} | {result['wall_s']:.1f} | " + " | ".join(cells) + f" | {result['staleness_max']} |")
    return max(result["rc"] for result in results.values())


if __name__ == "__main__":
    sys.exit(main())
