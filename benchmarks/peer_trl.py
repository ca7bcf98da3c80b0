"""TRL's GRPOTrainer and verlx side by side on one GPU: the same GRPO run, seconds per step of both (issue 26.1).

The run is benchmarks/peer_verl.py's: a Qwen2.5-shaped model with random weights (grpo_step_gpu.py builds it),
arithmetic prompts in the GSM8K schema, --prompts × --n samples a step with every response forced to
--response-length tokens, two optimizer steps a step (veRL's and verlx's mini-batch of half the prompts), no KL,
lr 1e-6, both scoring with benchmarks/peer_reward.py. verlx runs first with its defaults; TRL then runs in a
process of its own per attempt, in its strongest configuration the machine allows, tried in order until one
finishes every step (--all-attempts runs each; the fastest counts):

  vllm-colocate-sleep  vLLM in TRL's process (TRL 1.16 supports vLLM 0.22–0.31; the carried 0.26 qualifies),
                       gpu_memory_utilization as verlx's 0.4, asleep while TRL trains
  vllm-colocate        the same without sleep mode: vLLM's 0.4 of the card stays held during the update (at 1.5B
                       × 1,024 tokens it ran out of memory with 16,384-token micro-batches and was 5% slower than
                       the first with 8,192: docs/benchmarks.md, 2026-11-28)
  hf-continuous        transformers' continuous-batching generate
  hf-generate          transformers' generate

TRL's own choices that stay: its default dtype (the checkpoint's bf16: no fp32 master weights, which only makes
TRL faster than verlx's fp32 masters), its loss ("dapo"); changed from its defaults for speed: no gradient
checkpointing, micro-batches of the most samples whose tokens fit --trl-micro-batch-tokens. A TRL step is two of
its optimizer steps (one generation each two); the step's seconds are the time between every second optimizer
step's end, the generation's the time spent in TRL's single-turn generate (synchronised).

On the GPU machine (no network there), from this checkout:
  here:   bash benchmarks/peer_trl_wheels.sh             # .whl/peer_trl: TRL 1.16 and datasets
          bash ../shared/tools/engine-bundle.sh vllm     # .engines/vllm, for the vllm-colocate attempts
  there:  source .device/install.sh && source .engines/vllm/install.sh && \\
            python benchmarks/peer_trl.py --wheels .whl/peer_trl --shape 1.5b --response-length 1024

Prints both runs' per-step tables and the steady steps side by side (TRL / verlx); writes $OUT/peer_trl.json.

  python benchmarks/peer_trl.py --smoke     # CPU, tiny shape: verlx's side runs, then TRL if it is importable
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

import grpo_step_gpu  # noqa: E402 - after the sys.path entries above
import peer_reward  # noqa: E402
import peer_verl  # noqa: E402

WHEEL_TARGET = "/tmp/peer-trl"
ATTEMPTS = {
    "vllm-colocate-sleep": {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": True},
    "vllm-colocate": {"use_vllm": True, "vllm_mode": "colocate", "vllm_enable_sleep_mode": False},
    "hf-continuous": {"use_transformers_continuous_batching": True},
    "hf-generate": {},
}
UPDATES_PER_STEP = 2  # the mini-batch is half the prompts, as in verlx's and veRL's runs


def trl_config(args, attempt: str, out_dir: str) -> dict:
    """GRPOConfig's fields for one attempt (see the module docstring for each choice)."""
    samples = args.prompts * args.n
    mini_batch = samples // UPDATES_PER_STEP
    sequence_tokens = peer_verl.PROMPT_TOKENS + args.response_length
    micro = peer_verl.micro_batch(mini_batch, sequence_tokens, args.trl_micro_batch_tokens)
    forced = {"ignore_eos": True} if ATTEMPTS[attempt].get("use_vllm") else {"min_new_tokens": args.response_length}
    config = {
        "output_dir": out_dir, "max_steps": UPDATES_PER_STEP * args.steps, "learning_rate": 1e-6,
        "per_device_train_batch_size": micro, "gradient_accumulation_steps": mini_batch // micro,
        "generation_batch_size": samples, "num_generations": args.n, "max_completion_length": args.response_length,
        "temperature": 1.0, "beta": 0.0, "gradient_checkpointing": False, "logging_steps": 1, "report_to": "none",
        "save_strategy": "no", "seed": 0, "generation_kwargs": forced, "vllm_gpu_memory_utilization": 0.4,
        "vllm_max_model_length": sequence_tokens + 16, **ATTEMPTS[attempt],
    }
    if args.smoke:
        config.update(use_cpu=True, bf16=False)
    return config


def step_rows(train_start: float, step_ends: list[float], gen_seconds: list[tuple[float, float]],
              lengths: list[tuple[float, float]]) -> list[dict]:
    """verlx's row layout from TRL's optimizer steps: step k spans optimizer steps 2k-1 and 2k; its generation
    is the generate calls that ended within it ((end time, seconds)), its response length the mean of the lengths
    TRL logged within it ((time, mean length): one a generation)."""
    rows, start = [], train_start
    for k in range(len(step_ends) // UPDATES_PER_STEP):
        end = step_ends[UPDATES_PER_STEP * (k + 1) - 1]
        row = {"step": k + 1, "timing_s/step": end - start,
               "timing_s/gen": sum(s for t, s in gen_seconds if start < t <= end)}
        logged = [length for t, length in lengths if start < t <= end]
        if logged:
            row["response_length/mean"] = sum(logged) / len(logged)
        rows.append(row)
        start = end
    return rows


def arithmetic_reward(completions, ground_truth, **kwargs) -> list[float]:
    """peer_reward's score on TRL's completions (conversational: a list of messages each)."""
    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [peer_reward.compute_score("arithmetic", text, truth) for text, truth in zip(texts, ground_truth)]


def run_child(spec_path: str) -> int:
    """One TRL attempt (in its own process: TRL and vLLM keep GPU memory until the process ends)."""
    import pyarrow.parquet as pq
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    with open(spec_path) as f:
        spec = json.load(f)
    table = pq.read_table(spec["train_file"]).to_pylist()
    dataset = Dataset.from_list([{"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]}
                                 for row in table])
    step_ends, gen_seconds, lengths, start = [], [], [], []

    class Timing(TrainerCallback):
        """Rows written at every optimizer step's end, so that a run cut short keeps its finished steps."""

        def on_train_begin(self, args, state, control, **kwargs):
            start.append(time.perf_counter())

        def on_step_end(self, args, state, control, **kwargs):
            step_ends.append(time.perf_counter())
            with open(spec["rows_file"], "w") as f:
                json.dump(step_rows(start[0], step_ends, gen_seconds, lengths), f)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                lengths.append((time.perf_counter(), float(logs["completions/mean_length"])))

    class TimedGRPOTrainer(GRPOTrainer):
        """Times TRL's generation: its single-turn generate is the one call every generation path goes through."""

        def _generate_single_turn(self, *args, **kwargs):
            begin = time.perf_counter()
            result = super()._generate_single_turn(*args, **kwargs)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            gen_seconds.append((time.perf_counter(), time.perf_counter() - begin))
            return result

    trainer = TimedGRPOTrainer(model=spec["model_dir"], reward_funcs=arithmetic_reward,
                               args=GRPOConfig(**spec["config"]), train_dataset=dataset, callbacks=[Timing()])
    trainer.train()
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_trl(args, model_dir: str, data_dir: str, work: str) -> dict:
    """Each attempt in turn until one logs every step (every attempt with --all-attempts); what each did is kept."""
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "TOKENIZERS_PARALLELISM": "false"}
    if args.wheels:
        env["PYTHONPATH"] = os.pathsep.join([peer_verl.install_wheels(args.wheels, WHEEL_TARGET),
                                             env.get("PYTHONPATH", "")])
    tried, best = [], None
    for attempt in args.attempts.split(","):
        out_dir = os.path.join(work, f"trl-{attempt}")
        os.makedirs(out_dir, exist_ok=True)
        spec = {"model_dir": model_dir, "train_file": os.path.join(data_dir, "train.parquet"),
                "rows_file": os.path.join(os.environ.get("OUT") or out_dir, f"trl-{attempt}-rows.json"),
                "config": trl_config(args, attempt, out_dir)}
        spec_path = os.path.join(out_dir, "spec.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f, indent=1)
        record = {"attempt": attempt, "config": spec["config"]}
        tried.append(record)
        log_path = os.path.join(os.environ.get("OUT") or work, f"trl-{attempt}.log")  # kept if the job is cut
        begin = time.perf_counter()
        with open(log_path, "w") as log:
            try:
                rc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", spec_path], cwd=out_dir,
                                    env={**env, "MASTER_PORT": str(free_port())}, timeout=args.timeout_s,
                                    stdout=log, stderr=subprocess.STDOUT).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        with open(log_path, errors="replace") as f:
            tail = f.read().splitlines()[-25:]
        rows = grpo_step_gpu.load_json(spec["rows_file"]) if os.path.exists(spec["rows_file"]) else []
        record.update(rc=rc, wall_s=time.perf_counter() - begin, steps=len(rows), rows=rows, log_tail=tail)
        print(f"\nTRL attempt {attempt}: rc {rc}, {len(rows)} steps in {record['wall_s']:.0f} s", flush=True)
        if len(rows) < args.steps:
            print("\n".join(tail), flush=True)
            continue
        grpo_step_gpu.print_rows(rows, f"TRL ({attempt}): ")
        if best is None or peer_verl.steady(rows, "timing_s/step") < peer_verl.steady(best["rows"], "timing_s/step"):
            best = record
        if not args.all_attempts:
            break
    return {"tried": tried, "rows": best["rows"] if best else [], "attempt": best["attempt"] if best else None}


def side_by_side(verlx_rows: list[dict], trl_rows: list[dict], samples_per_step: int) -> list[dict]:
    """Steady seconds per step and generation, and generated tokens per second, of both; TRL / verlx."""
    table = []
    for key in ("timing_s/step", "timing_s/gen"):
        table.append({"metric": key, "verlx": peer_verl.steady(verlx_rows, key),
                      "trl": peer_verl.steady(trl_rows, key)})
    rates = {}
    for name, rows in (("verlx", verlx_rows), ("trl", trl_rows)):
        step, length = peer_verl.steady(rows, "timing_s/step"), peer_verl.steady(rows, "response_length/mean")
        rates[name] = samples_per_step * length / step if step and length else None
    table.append({"metric": "generated tok/s", **rates})
    for row in table:
        a, b = row["verlx"], row["trl"]
        row["trl / verlx"] = b / a if a and b is not None else None
    print("\n| steady state (steps ≥ 2) | verlx | TRL | TRL / verlx |\n|---|---|---|---|")
    for row in table:
        cells = [f"{row[k]:.4g}" if isinstance(row[k], float) else "-" for k in ("verlx", "trl", "trl / verlx")]
        print(f"| {row['metric']} | " + " | ".join(cells) + " |")
    return table


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="0.5b", choices=list(grpo_step_gpu.SHAPES))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--wheels", help="directory of the wheels benchmarks/peer_trl_wheels.sh downloaded")
    p.add_argument("--attempts", default=",".join(ATTEMPTS), help=f"tried in order: {', '.join(ATTEMPTS)}")
    p.add_argument("--all-attempts", action="store_true", help="run every attempt; the fastest steady step counts")
    p.add_argument("--trl-micro-batch-tokens", type=int, default=16384, help="TRL's micro-batch, in tokens")
    p.add_argument("--timeout-s", type=int, default=1500, help="per TRL attempt")
    p.add_argument("--skip-verlx", action="store_true", help="TRL only (verlx measured beside it elsewhere)")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shape; TRL with transformers' generate")
    args = p.parse_args(argv)
    if args.smoke:
        grpo_step_gpu.apply_smoke(args)
        args.attempts = "hf-generate"
    return args


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--child"]:
        return run_child(sys.argv[2])
    args = parse_args(argv)
    work = tempfile.mkdtemp(prefix="verlx-peer-trl-")
    model_dir, data_dir = grpo_step_gpu.prepare_inputs(work, args.shape)
    verlx = {"rows": [], "rc": 0}
    if not args.skip_verlx:
        verlx_args = grpo_step_gpu.parse_args([
            "--shape", args.shape, "--steps", str(args.steps), "--prompts", str(args.prompts), "--n", str(args.n),
            "--response-length", str(args.response_length), "--ignore-eos", *(["--smoke"] if args.smoke else []),
            "--extra", "actor_rollout_ref.actor.use_kl_loss=false",
            f"custom_reward_function.path={peer_verl.REWARD_FILE}"])
        verlx = grpo_step_gpu.run_once(verlx_args, model_dir, data_dir, work, "verlx", dict(os.environ))
    trl = run_trl(args, model_dir, data_dir, work)
    table = side_by_side(verlx["rows"], trl["rows"], args.prompts * args.n)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "peer_trl.json"), "w") as f:
            json.dump({"args": vars(args), "verlx": verlx["rows"], "trl": trl, "side_by_side": table}, f, indent=1)
    return verlx["rc"] or (0 if trl["rows"] else 1)


if __name__ == "__main__":
    sys.exit(main())
