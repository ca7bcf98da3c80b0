"""GRPO that learns on a GPU: a 63M-parameter Qwen2 SFT'd to partial competence, then GRPO through main_ppo.

Stages (each cached in --out: a stage whose output exists is skipped, so SFT runs once for every GRPO run):
  data   the model, randomly initialised (Qwen2 architecture, the quick start's byte-level tokenizer: vocabulary 259),
         and the word problems of benchmarks/learning_task.py as train/val/test parquet in veRL's schema
  sft    `python -m verlx.trainer.main_sft` on the training split (the teacher's worked solutions), validated on the
         val split every --sft-test-freq steps, --sft-steps steps (or until --sft-target accuracy)
  grpo   `python -m verlx.trainer.main_ppo` from the SFT model with --engine, --gpus (--rollout-tp), --mode, --seed;
         greedy accuracy on the test split before training and every --test-freq steps
  all    the three in turn; report: the table of every run in --out (benchmarks/learning_report.py)

Every GRPO run writes <out>/runs/<name>/summary.json (accuracy per validation, seconds per step, training seconds
to each validation, start/end/gain) and copies it to $OUT/learning/. Training seconds are measured outside the
trainer, the same way for verlx and veRL (benchmarks/peer_verl.py --learning): the time each metrics line appears,
from the first (the validation before training), less the validations' own time (timing_s/testing).

  python benchmarks/learning_gpu.py --out /tmp/learn --stage data                 # then sft, then grpo runs:
  CUDA_VISIBLE_DEVICES=0 python benchmarks/learning_gpu.py --out /tmp/learn --stage grpo --seed 0 &
  CUDA_VISIBLE_DEVICES=1 python benchmarks/learning_gpu.py --out /tmp/learn --stage grpo --seed 1
  python benchmarks/learning_gpu.py --out /tmp/learn --stage grpo --engine sglang --gpus 2 --rollout-tp 2
  python benchmarks/learning_gpu.py --out /tmp/learn --stage grpo --mode async --gpus 2   # 1 trainer + 1 rollout
  python benchmarks/learning_gpu.py --smoke --out /tmp/learn-smoke                       # CPU, tiny model, 2 steps
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [ROOT, HERE]

import learning_task  # noqa: E402 - after the sys.path entries above

REWARD_FILE = os.path.join(HERE, "peer_reward.py")
VAL_KEY = f"val-core/{learning_task.DATA_SOURCE}/reward/mean@1"
SHAPES = {  # Qwen2; the vocabulary is the byte-level tokenizer's 259
    "learn": dict(hidden_size=768, num_hidden_layers=10, num_attention_heads=12, num_key_value_heads=4,
                  intermediate_size=2048),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128),
}
MAX_POSITIONS = 512
MODES = ("sync", "one_step_off", "async")


def paths(out: str) -> dict[str, str]:
    names = ("model_init", "data", "sft_model", "sft_logs", "runs")
    return {name: os.path.join(out, name) for name in names} | {"info": os.path.join(out, "data", "info.json"),
                                                                  "sft_summary": os.path.join(out, "sft.json")}


def load_json(path: str):
    with open(path) as f:
        return json.load(f)


def write_json(path: str, value) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(value, f, indent=1)


def export(name: str, value) -> None:
    """A copy in $OUT/learning/ (small files: what comes back from the GPU machine)."""
    if os.environ.get("OUT"):
        write_json(os.path.join(os.environ["OUT"], "learning", name), value)


# ---------------------------------------------------------------------------------------------------------- data
def stage_data(args, p: dict) -> dict:
    from verlx.data.parquet import write_parquet_atomic
    from verlx.models.tiny import TinyModelSpec, build_tokenizer, save_tiny_model

    if os.path.exists(p["info"]):
        print(f"data: cached in {p['data']}")
        return load_json(p["info"])
    spec = TinyModelSpec(**SHAPES[args.shape], max_position_embeddings=MAX_POSITIONS)
    save_tiny_model(p["model_init"], seed=0, spec=spec)
    sizes = {"test": args.test_size, "val": args.val_size, "train": args.train_size}
    splits = learning_task.make_splits(sizes, args.data_seed, args.teacher_error, args.min_ops, args.max_ops)
    tokenizer = build_tokenizer(MAX_POSITIONS)
    for split, rows in splits.items():
        write_parquet_atomic(rows, os.path.join(p["data"], f"{split}.parquet"))
    # GRPO's prompts: the first --rl-size training problems (steps × prompts need far fewer than SFT's rows, and
    # both trainers tokenize every row of their training file when they start)
    write_parquet_atomic(splits["train"][: args.rl_size], os.path.join(p["data"], "rl_train.parquet"))
    longest = max((r for rows in splits.values() for r in rows), key=lambda r: len(r["prompt"][0]["content"]))
    prompt_tokens = len(tokenizer.apply_chat_template(longest["prompt"], add_generation_prompt=True, tokenize=True,
                                                      return_dict=False))
    response_tokens = max(len(tokenizer(r["extra_info"]["answer"])["input_ids"]) for r in splits["train"])
    info = {
        "shape": args.shape, "parameters": _parameters(spec), "sizes": sizes, "rl_size": args.rl_size,
        "data_seed": args.data_seed, "teacher_error": args.teacher_error, "ops": [args.min_ops, args.max_ops],
        "max_prompt_tokens": prompt_tokens, "max_solution_tokens": response_tokens,
        "train_solutions_correct": sum(map(learning_task.solution_is_correct, splits["train"])) / args.train_size,
        "greedy_teacher_ceiling": {s: learning_task.greedy_teacher_ceiling(rows) for s, rows in splits.items()},
    }
    write_json(p["info"], info)
    print(f"data: {info}")
    return info


def _parameters(spec) -> int:
    from verlx.models.tiny import build_model

    return sum(t.numel() for t in build_model(spec).parameters())


# ----------------------------------------------------------------------------------------------------------- sft
def sft_command(args, p: dict, info: dict) -> list[str]:
    return [
        sys.executable, "-m", "verlx.trainer.main_sft",
        f"data.train_files={p['data']}/train.parquet", f"data.val_files={p['data']}/val.parquet",
        f"data.max_length={info['max_prompt_tokens'] + info['max_solution_tokens'] + 1}",
        f"data.train_batch_size={args.sft_batch}", f"data.micro_batch_size_per_gpu={args.sft_batch}",
        f"data.val_batch_size={args.val_size}", f"data.val_max_new_tokens={args.response_length}",
        f"model.partial_pretrain={p['model_init']}", f"optim.lr={args.sft_lr}", "optim.min_lr_ratio=0.1",
        f"trainer.total_training_steps={args.sft_steps}", f"trainer.test_freq={args.sft_test_freq}",
        f"trainer.log_freq={args.sft_test_freq}",
        f"trainer.target_val_accuracy={'null' if args.sft_target is None else args.sft_target}",
        f"trainer.default_local_dir={p['sft_model']}", f"trainer.output_dir={p['sft_logs']}",
        "trainer.project_name=learning_gpu", "trainer.experiment_name=sft", *args.sft_extra,
    ]


def stage_sft(args, p: dict, info: dict) -> dict:
    if os.path.exists(p["sft_summary"]) and os.path.exists(os.path.join(p["sft_model"], "config.json")):
        print(f"sft: cached in {p['sft_model']}")
        return load_json(p["sft_summary"])
    metrics_path = os.path.join(p["sft_logs"], "metrics.jsonl")
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    cmd = sft_command(args, p, info)
    print("$ " + " ".join(cmd), flush=True)
    start = time.time()
    rc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"}).returncode
    rows = read_jsonl(metrics_path)
    vals = [{"step": r["step"], "accuracy": r["val/accuracy"]} for r in rows if "val/accuracy" in r]
    summary = {"rc": rc, "wall_s": time.time() - start, "command": " ".join(cmd), "validations": vals,
               "accuracy": vals[-1]["accuracy"] if vals else None,
               "steps": rows[-1].get("train/steps") if rows else None, "info": info}
    if rc != 0:
        raise SystemExit(f"main_sft failed (rc {rc}); its metrics: {metrics_path}")
    write_json(p["sft_summary"], summary)
    export("sft.json", summary)
    print(f"sft: held-out greedy accuracy {summary['accuracy']} after {summary['steps']} steps, "
          f"{summary['wall_s']:.0f} s")
    return summary


# ---------------------------------------------------------------------------------------------------------- grpo
def layout(args) -> str:
    if args.mode != "sync":
        return "1t1r"  # one trainer GPU, one rollout GPU (a name $OUT brings back: letters, digits, dashes)
    return "1gpu" if args.gpus == 1 else f"dp{args.gpus}" + (f"-tp{args.rollout_tp}" if args.rollout_tp > 1 else "")


def run_name(args) -> str:
    return args.name or f"verlx-{args.engine}-{layout(args)}-{args.mode}-s{args.seed}"


def placement_overrides(args) -> list[str]:
    """sync: every GPU trains and generates (colocated); one_step_off/async: one trainer GPU and one rollout GPU,
    staleness ≤ --max-staleness in async, token-level truncated IS (rollout correction) in both."""
    if args.mode == "sync":
        return [f"trainer.n_gpus_per_node={args.gpus}",
                f"actor_rollout_ref.rollout.tensor_model_parallel_size={args.rollout_tp}"]
    overrides = ["actor_rollout_ref.hybrid_engine=false", "trainer.n_gpus_per_node=1", "rollout.n_gpus_per_node=1",
                 f"trainer.rollout_mode={args.mode}", "algorithm.rollout_correction.rollout_is=token",
                 "algorithm.rollout_correction.rollout_is_threshold=2.0"]
    return overrides + ([f"trainer.max_staleness={args.max_staleness}"] if args.mode == "async" else [])


def grpo_overrides(args, p: dict, info: dict, run_dir: str) -> list[str]:
    """The GRPO run; benchmarks/peer_verl.py --learning gives veRL the same values."""
    overrides = [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false", "algorithm.norm_adv_by_std_in_grpo=true",
        f"data.train_files={p['data']}/rl_train.parquet", f"data.val_files={p['data']}/test.parquet",
        f"data.train_batch_size={args.prompts}", f"data.max_prompt_length={info['max_prompt_tokens']}",
        f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={p['sft_model']}",
        f"actor_rollout_ref.actor.optim.lr={args.lr}", "actor_rollout_ref.actor.optim.weight_decay=0.01",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // args.updates_per_step}",
        "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.use_kl_loss=false",
        f"actor_rollout_ref.rollout.name={args.engine}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.temperature=1.0", "actor_rollout_ref.rollout.top_p=1.0",
        f"actor_rollout_ref.rollout.seed={args.seed}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={args.gpu_memory_utilization}",
        f"custom_reward_function.path={REWARD_FILE}", "custom_reward_function.name=compute_score",
        f"trainer.seed={args.seed}", f"trainer.total_training_steps={args.steps}",
        f"trainer.test_freq={args.test_freq}", "trainer.val_before_train=true", "trainer.save_freq=-1",
        "trainer.resume_mode=disable", "trainer.logger=[console,file]", "trainer.progress_bar=false",
        "trainer.project_name=learning_gpu", f"trainer.experiment_name={run_name(args)}",
        f"trainer.output_dir={run_dir}", f"trainer.default_local_dir={run_dir}/ckpt",
        *placement_overrides(args),
    ]
    if args.smoke:
        overrides += ["trainer.device=cpu", "reward.num_workers=0"]
    return [*overrides, *args.extra]


def read_jsonl(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def run_watched(cmd: list[str], cwd: str, env: dict, log_path: str, metrics_path: str, label: str,
                timeout_s: float, parse=json.loads, on_rows=None, grace_s: float = 30) -> dict:
    """Run `cmd` (output to `log_path`) and note the wall-clock time each line of its metrics file appears; a
    compact line per logged step is printed and `on_rows(timed rows so far)` called (a run cut short keeps what it
    logged). At `timeout_s` the run gets SIGTERM, and SIGKILL if it is still there `grace_s` later. Returns rc,
    [(row, seconds since start)], the run's wall time and whether `timeout_s` stopped it."""
    if os.path.exists(metrics_path):
        os.remove(metrics_path)
    timed_rows, offset, start, stopped_at_limit = [], 0, time.time(), False

    def poll() -> None:
        nonlocal offset
        if not os.path.exists(metrics_path):
            return
        with open(metrics_path) as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind("\n") + 1]
        offset += len(complete.encode())
        rows = [row for row in map(parse, filter(str.strip, complete.splitlines())) if row is not None]
        for row in rows:
            timed_rows.append((row, time.time() - start))
            print(progress_line(label, row), flush=True)
        if rows and on_rows is not None:
            on_rows(timed_rows)

    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            while proc.poll() is None:
                poll()
                if time.time() - start > timeout_s:
                    stopped_at_limit = True
                    os.killpg(proc.pid, signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(grace_s)
                    break
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        poll()
    return {"rc": proc.returncode, "timed_rows": timed_rows, "wall_s": time.time() - start,
            "stopped_at_limit": stopped_at_limit}


PROGRESS = ((VAL_KEY, "held-out accuracy"), ("critic/score/mean", "train score"), ("timing_s/step", "step s"))


def progress_line(label: str, row: dict) -> str:
    cells = [f"{name} {_float(row[key]):.3g}" for key, name in PROGRESS if key in row]
    return f"[{label}] step {row.get('step')}: " + ", ".join(cells)


def _float(value) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def learning_summary(timed_rows: list[tuple[dict, float]], meta: dict, val_size: int) -> dict:
    """Accuracy per validation and training seconds to it: the time its line appeared after the first line (the
    validation before training) less the time of the validations logged since, never less than the step before's
    (lines read in one poll share a time, and the later one's validation would put it before the earlier); seconds
    per step."""
    curve, steps, testing, origin, elapsed = [], [], 0.0, None, 0.0
    for row, seconds in sorted(timed_rows, key=lambda item: item[0].get("step", 0)):
        if origin is None:
            origin = seconds
        elif "timing_s/testing" in row:
            testing += _float(row["timing_s/testing"])
        elapsed = max(elapsed, seconds - origin - testing)
        if "timing_s/step" in row:
            steps.append({"step": row["step"], "step_s": _float(row["timing_s/step"]), "elapsed_s": elapsed,
                          "score": _float(row.get("critic/score/mean")),
                          "response_length": _float(row.get("response_length/mean"))})
        if VAL_KEY in row:
            curve.append({"step": row["step"], "accuracy": _float(row[VAL_KEY]), "elapsed_s": elapsed})
    summary = {**meta, "val_key": VAL_KEY, "val_size": val_size, "gain_resolution_95": gain_resolution(val_size),
               "curve": curve, "steps": steps,
               "start_accuracy": None, "end_accuracy": None, "gain": None, "best_accuracy": None,
               "mean_step_s": _mean([s["step_s"] for s in steps if s["step"] >= 2]),
               "train_s": steps[-1]["elapsed_s"] if steps else None}
    if curve:
        start, end = curve[0]["accuracy"], curve[-1]["accuracy"]
        summary.update(start_accuracy=start, end_accuracy=end, gain=end - start,
                       best_accuracy=max(c["accuracy"] for c in curve))
    return summary


def gain_resolution(n: int) -> float:
    """Half-width of the 95% interval of the difference of two accuracies measured on n prompts each, at its
    widest (both near 50%; taken as independent, which overstates it for the same prompts): a gain smaller than
    this cannot be told from noise."""
    return 1.96 * math.sqrt(0.5 / max(n, 1))


def _mean(values: list[float]) -> float | None:
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else None


def environment() -> dict:
    """What the numbers ran on: date, device, versions (the engines' when installed)."""
    from importlib import metadata

    import torch

    versions = {}
    for package in ("torch", "transformers", "ray", "sglang", "vllm", "verl"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[package] = metadata.version(package)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return {"date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "versions": versions, "verlx_commit": commit.stdout.strip() or None}


def hyperparameters(args) -> dict:
    keys = ("prompts", "n", "steps", "lr", "updates_per_step", "response_length", "test_freq", "seed")
    return {key: getattr(args, key) for key in keys}


def stage_grpo(args, p: dict, info: dict) -> dict:
    name = run_name(args)
    run_dir = os.path.join(p["runs"], name)
    os.makedirs(run_dir, exist_ok=True)
    cmd = [sys.executable, "-m", "verlx.trainer.main_ppo", *grpo_overrides(args, p, info, run_dir)]
    print("$ " + " ".join(cmd), flush=True)
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
    meta = {"name": name, "system": "verlx", "engine": args.engine, "layout": layout(args), "mode": args.mode,
            "seed": args.seed, "rc": None, "wall_s": None, "command": " ".join(cmd),
            "hyperparameters": hyperparameters(args), "samples_per_step": args.prompts * args.n,
            "sft_accuracy": load_json(p["sft_summary"]).get("accuracy"), **environment()}

    def save(timed_rows) -> dict:
        summary = learning_summary(timed_rows, meta, args.test_size)
        write_json(os.path.join(run_dir, "summary.json"), summary)
        export(f"{name}.json", summary)
        return summary

    result = run_watched(cmd, ROOT, env, os.path.join(run_dir, "run.log"), os.path.join(run_dir, "metrics.jsonl"),
                         name, args.timeout_s, on_rows=save)
    meta.update(rc=result["rc"], wall_s=result["wall_s"], stopped_at_limit=result["stopped_at_limit"])
    summary = save(result["timed_rows"])
    if result["rc"] != 0:
        with open(os.path.join(run_dir, "run.log"), errors="replace") as f:
            print("".join(f.readlines()[-40:]))
    print_runs([summary])
    return summary


def print_runs(summaries: list[dict]) -> None:
    def pct(value):
        return "-" if value is None else f"{100 * value:.1f}"

    print("\n| run | rc | start % | end % | gain (points) | best % | validations | s/step | training s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for s in summaries:
        step_s = "-" if s["mean_step_s"] is None else f"{s['mean_step_s']:.2f}"
        train_s = "-" if s["train_s"] is None else f"{s['train_s']:.1f}"
        print(f"| {s['name']} | {s['rc']} | {pct(s['start_accuracy'])} | {pct(s['end_accuracy'])} | "
              f"{pct(s['gain'])} | {pct(s['best_accuracy'])} | {len(s['curve'])} | {step_s} | {train_s} |")
    for s in summaries:
        if s["gain_resolution_95"] >= 0.15:
            print(f"{s['name']}: {s['val_size']} held-out prompts cannot resolve a 15-point gain (±"
                  f"{100 * s['gain_resolution_95']:.1f} points at 95%); use --test-size 200 or more")


# ----------------------------------------------------------------------------------------------------------- cli
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="working directory: model, data, SFT model, runs (cached)")
    p.add_argument("--stage", default="all", choices=("data", "sft", "grpo", "all", "report"))
    p.add_argument("--smoke", action="store_true", help="CPU: tiny model, tiny data, a few SFT and 2 GRPO steps")
    g = p.add_argument_group("data and model")
    g.add_argument("--shape", default="learn", choices=list(SHAPES))
    g.add_argument("--train-size", type=int, default=40000, help="SFT's problems")
    g.add_argument("--rl-size", type=int, default=8192, help="GRPO's prompts: the first of the training problems")
    g.add_argument("--val-size", type=int, default=256, help="SFT's stopping check")
    g.add_argument("--test-size", type=int, default=512, help="GRPO's held-out accuracy")
    g.add_argument("--teacher-error", type=float, default=0.6, help="see benchmarks/learning_task.py")
    g.add_argument("--min-ops", type=int, default=2)
    g.add_argument("--max-ops", type=int, default=4)
    g.add_argument("--data-seed", type=int, default=0)
    g = p.add_argument_group("sft")
    g.add_argument("--sft-steps", type=int, default=1500)
    g.add_argument("--sft-batch", type=int, default=128)
    g.add_argument("--sft-lr", type=float, default=1e-3)
    g.add_argument("--sft-test-freq", type=int, default=250)
    g.add_argument("--sft-target", type=float, help="stop at this val accuracy (default: train every step; the "
                   "teacher's slips, not the step count, cap the accuracy)")
    g.add_argument("--sft-extra", nargs="*", default=[], help="more main_sft key=value overrides")
    g = p.add_argument_group("grpo")
    g.add_argument("--engine", default="native", choices=("native", "sglang", "vllm", "hf"))
    g.add_argument("--gpus", type=int, default=1, choices=(1, 2))
    g.add_argument("--rollout-tp", type=int, default=1, help="rollout tensor parallel size (sync, --gpus 2)")
    g.add_argument("--mode", default="sync", choices=MODES)
    g.add_argument("--max-staleness", type=int, default=2)
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--steps", type=int, default=40)
    g.add_argument("--prompts", type=int, default=64, help="data.train_batch_size")
    g.add_argument("--n", type=int, default=8, help="samples per prompt")
    g.add_argument("--lr", type=float, default=3e-5)
    g.add_argument("--updates-per-step", type=int, default=2, help="mini-batches per step")
    g.add_argument("--response-length", type=int, default=64)
    g.add_argument("--test-freq", type=int, default=5)
    g.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    g.add_argument("--timeout-s", type=float, default=900, help="per GRPO run")
    g.add_argument("--name", help="run name (default: verlx-<engine>-<layout>-<mode>-s<seed>)")
    g.add_argument("--extra", nargs="*", default=[], help="more main_ppo key=value overrides")
    args = p.parse_args(argv)
    if args.smoke:
        apply_smoke(args)
    check_args(p, args)
    return args


def apply_smoke(args) -> None:
    """The CPU pipeline check: tiny model and data, SFT 30 steps, GRPO 2 steps of 4 prompts × 2, validating each."""
    args.shape, args.train_size, args.rl_size, args.val_size, args.test_size = "tiny", 256, 64, 8, 8
    args.sft_steps, args.sft_batch, args.sft_lr, args.sft_test_freq, args.sft_target = 30, 16, 3e-3, 10, None
    args.steps, args.prompts, args.n, args.response_length, args.test_freq = 2, 4, 2, 16, 1
    args.updates_per_step = 1


def check_args(parser, args) -> None:
    """Layouts this benchmark knows, checked before anything starts."""
    if args.mode != "sync" and (args.gpus != 2 or args.rollout_tp != 1):
        parser.error(f"--mode {args.mode} runs one trainer GPU and one rollout GPU: pass --gpus 2 (--rollout-tp 1)")
    if not args.prompts * args.steps <= args.rl_size <= args.train_size:
        parser.error(f"--rl-size {args.rl_size} must be within [--prompts × --steps = {args.prompts * args.steps}, "
                     f"--train-size {args.train_size}]")
    if args.rollout_tp not in (1, args.gpus):
        parser.error(f"--rollout-tp {args.rollout_tp} must be 1 or --gpus ({args.gpus})")
    if args.prompts % args.updates_per_step or (args.prompts // args.updates_per_step) % args.gpus:
        parser.error(f"--prompts {args.prompts} must split into --updates-per-step {args.updates_per_step} "
                     f"mini-batches divisible by --gpus {args.gpus}")


def main(argv=None) -> int:
    args = parse_args(argv)
    p = paths(os.path.abspath(args.out))
    if args.stage == "report":
        import learning_report

        return learning_report.main([p["runs"]])
    info = stage_data(args, p)
    if args.stage in ("sft", "grpo", "all"):
        stage_sft(args, p, info)
    if args.stage in ("grpo", "all"):
        summary = stage_grpo(args, p, info)
        return summary["rc"] or (0 if summary["curve"] else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
