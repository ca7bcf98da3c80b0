"""GRPO through main_ppo on 1, 2 and 4 GPUs of one host, colocated (FSDP dp=N, the engine at TP=1, 2 or 4 on the
same GPUs): tokens/s/GPU as the GPUs grow, and each rank's GPU memory awake after generation and after the update,
with the spread across ranks (the TP memory-imbalance check of veRL's SGLang guide: within 10%).

  python benchmarks/scaling_gpu.py --shape 1.5b --engine sglang --layouts 1x1 2x1 4x1 4x2 4x4
  python benchmarks/scaling_gpu.py --smoke                       # CPU: tiny shape, hf engine, 1x1 and 2x1

A layout is GPUSxTP. Weak scaling: each GPU gets --prompts-per-gpu prompts (× --n samples), so tokens/s/GPU stays
flat when the added GPUs cost nothing. Random weights with `ignore_eos` (every response --response-length tokens).
Each run is cut at --timeout-s and recorded; the next one still runs. Prints a table; $OUT/scaling_<engine>_<shape>.json
keeps it, with each run's metrics.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

from grpo_step_gpu import prepare_inputs, read_rows, verlx_overrides  # noqa: E402

SHOWN = {"step s": "timing_s/step", "gen s": "timing_s/gen", "engine generating s": "timing_s/generate_engine",
         "wake weights s": "timing_s/wake_weights", "engine sleep s": "timing_s/engine_sleep",
         "update s": "timing_s/update_actor",
         "tokens/s/GPU": "perf/throughput", "awake GB (max)": "perf/device_memory_used_gb/gen",
         "awake spread": "perf/device_memory_imbalance/gen", "awake most rank": "perf/device_memory_most_rank/gen",
         "awake spread, trainer's own": "perf/device_memory_own_imbalance/gen",
         "awake spread, the rest": "perf/device_memory_others_imbalance/gen",
         "after update GB (max)": "perf/device_memory_used_gb/actor",
         "after update spread": "perf/device_memory_imbalance/actor", "peak alloc GB": "perf/max_memory_allocated_gb"}


def parse_layout(text: str) -> tuple[int, int]:
    gpus, tp = (int(v) for v in text.lower().split("x"))
    if gpus % tp:
        raise argparse.ArgumentTypeError(f"layout {text}: the rollout TP size {tp} must divide the {gpus} GPUs")
    return gpus, tp


def run_layout(args, gpus: int, tp: int, model_dir: str, data_dir: str, work: str) -> dict:
    name = f"{gpus}x{tp}"
    run_args = argparse.Namespace(**{**vars(args), "gpus": gpus, "prompts": args.prompts_per_gpu * gpus,
                                     "micro_batches": "auto", "ignore_eos": True})
    run_args.extra = [*args.extra, f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
                      "actor_rollout_ref.actor.use_kl_loss=false", "trainer.save_freq=-1",
                      "trainer.save_on_signal=false"]  # a run cut at --timeout-s stops at once, saving nothing
    out_dir = os.path.join(work, f"{args.engine}_{name}")  # engines share --work (its checkpoint), not their runs
    shutil.rmtree(out_dir, ignore_errors=True)  # metrics.jsonl appends: a repeated run's rows are its own only
    cmd = ["timeout", "-k", "30", str(args.timeout_s), sys.executable, "-m", "verlx.trainer.main_ppo",
           *verlx_overrides(run_args, model_dir, data_dir, out_dir)]
    with open(f"{out_dir}.log", "w") as log:
        rc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT).returncode
    rows = read_rows(os.path.join(out_dir, "metrics.jsonl"))
    return {"layout": name, "gpus": gpus, "tp": tp, "rc": rc, "steps": [r["step"] for r in rows],
            "summary": summarize(rows), "rows": rows}


def summarize(rows: list[dict]) -> dict:
    """The median of each shown metric over the steps after the first (step 1 compiles; alone, it is used)."""
    later = rows[1:] or rows
    return {label: statistics.median(r[key] for r in later) if later and all(key in r for r in later) else None
            for label, key in SHOWN.items()}


def print_table(results: list[dict]) -> None:
    print("\n| layout (GPUs x rollout TP) | exit | steps | " + " | ".join(SHOWN) + " |")
    print("|---" * (len(SHOWN) + 3) + "|")
    for r in results:
        cells = [f"{v:.3g}" if isinstance(v, float) else "-" for v in r["summary"].values()]
        print(f"| {r['layout']} | {r['rc']} | {r['steps']} | " + " | ".join(cells) + " |")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1.5b")
    p.add_argument("--engine", default="sglang")
    p.add_argument("--layouts", nargs="+", type=parse_layout, default=[(1, 1), (2, 1), (4, 1), (4, 2), (4, 4)])
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts-per-gpu", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--timeout-s", type=int, default=240, help="each run's limit")
    p.add_argument("--work", default=None, help="working directory (the model and data are built once there)")
    p.add_argument("--smoke", action="store_true", help="CPU: tiny shape, hf engine, 1x1 and 2x1, 2 steps")
    p.add_argument("--extra", nargs="*", default=[], help="more key=value overrides for every run")
    args = p.parse_args(argv)
    if args.smoke:
        args.shape, args.engine, args.layouts, args.steps = "tiny", "hf", [(1, 1), (2, 1)], 2
        args.prompts_per_gpu, args.n, args.response_length = 2, 2, 8
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    work = args.work or tempfile.mkdtemp(prefix="verlx-scaling-")
    os.makedirs(work, exist_ok=True)
    if not os.path.isdir(os.path.join(work, "model")):
        prepare_inputs(work, args.shape)
    model_dir, data_dir = os.path.join(work, "model"), os.path.join(work, "data")
    path = os.path.join(os.environ.get("OUT") or work, f"scaling_{args.engine}_{args.shape}.json")
    earlier = []  # an earlier call's layouts
    if os.path.exists(path):
        with open(path) as f:
            earlier = json.load(f)["runs"]
    results = []
    for gpus, tp in args.layouts:
        results.append(run_layout(args, gpus, tp, model_dir, data_dir, work))
        print_table(results[-1:])
        with open(path, "w") as f:  # after every layout: a call cut short keeps what finished
            json.dump({"args": {k: v for k, v in vars(args).items() if k != "layouts"},
                       "runs": [*earlier, *results]}, f, indent=1)
    print_table(results)
    return max(r["rc"] for r in results)


if __name__ == "__main__":
    sys.exit(main())
