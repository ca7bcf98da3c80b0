"""veRL 0.9.1 and verlx side by side on one GPU: the same GRPO run, phase timings of both from their own metrics.

The run (issue 16): a Qwen2.5-0.5B-shaped model with random weights (benchmarks/grpo_step_gpu.py builds it: bf16
safetensors, Qwen's 151,936-token vocabulary, the quick start's byte-level tokenizer), arithmetic prompts in the
GSM8K schema, 64 prompts × 4 samples, 256 response tokens forced (rollout.ignore_eos), no KL, `--steps` steps
each; both score with benchmarks/peer_reward.py. verlx runs first with its defaults (the workers size the
micro-batches; their choices are read from the log); veRL then gets the same model, data, batch, mini-batch,
lengths and the token budgets verlx chose, in veRL's strongest ordinary configuration: vLLM rollout (async mode,
CUDA graphs, sleep between phases), dynamic batch sizes, remove-padding, no gradient checkpointing, torch.compile
on (its default), FSDP with fp32 master weights like verlx.

veRL's defaults it has to leave: rollout.tensor_model_parallel_size 2 → 1 (one GPU); flash_attention_2 → sdpa
(flash-attn is not installed on the machine and cannot be built there; veRL's remove-padding then relies on
transformers' packed-sequence masks); data_source "arithmetic" is unknown to veRL's built-in scores (the shared
reward file). If an attempt fails, the next --verl-attempts entry is tried (the V0 trainer, which does not need
TransferQueue; padded batches with verlx's token budgets; padded fixed micro-batches of the most rows whose padded
tokens fit 16,384 — with sdpa, veRL's remove-padding path runs at a few % MFU (2026-11-26), so padded rows of forced
full-length responses may well be its fastest here); every attempt's command, exit status and last error lines are
printed and saved. --all-attempts runs every attempt and takes the fastest steady step as veRL's.

On the GPU machine (no network there), from this checkout:
  here:   bash benchmarks/peer_verl_wheels.sh            # .whl/peer_verl: veRL and its missing pure-Python deps
          bash ../shared/tools/engine-bundle.sh vllm     # .engines/vllm: vLLM 0.26 in parts + install.sh
  there:  carry each part of .engines/vllm as engine-bundle.sh says, then, carrying .device, .whl/peer_verl and
          .engines/vllm/install.sh:
          source .device/install.sh && source .engines/vllm/install.sh && \\
            python benchmarks/peer_verl.py --wheels .whl/peer_verl --steps 3
  shapes: --shape 1.5b; --response-length 1024 (generation dominates)

Prints the two runs' per-step tables and a side-by-side of the steady steps (mean of steps ≥ 2): seconds per step
and per phase, generated tokens per second, veRL / verlx. Writes $OUT/peer_verl.json (and both metric files).

  python benchmarks/peer_verl.py --smoke    # CPU: verlx's side on the tiny shape, veRL's command printed, not run

--learning (issue 24): veRL on benchmarks/learning_gpu.py's run instead: the SFT model and data in --out (built
first when absent), the reward file above, learning_gpu's GRPO hyperparameters under veRL's keys (64 prompts × 8,
lr, two mini-batches per step, no KL, T=1, greedy validation on the test split before training and every
test_freq steps, --seed for the data order and sampling) and the token budgets verlx's vLLM run chose (its log in
--out/runs). Its summary has learning_gpu's layout (system "verl": accuracy per validation, training seconds
measured the same way), in --out/runs/verl-vllm-1gpu-sync-s<seed>/ and $OUT/learning/;
benchmarks/learning_report.py sets it beside verlx's runs.

  python benchmarks/peer_verl.py --learning --out /tmp/learn --seed 0 --wheels .whl/peer_verl
  python benchmarks/peer_verl.py --learning --out /tmp/learn-smoke --smoke   # CPU: veRL's commands printed
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [ROOT, os.path.dirname(os.path.abspath(__file__))]

import grpo_step_gpu  # noqa: E402 - after the sys.path entries above
import learning_gpu  # noqa: E402

REWARD_FILE = os.path.join(ROOT, "benchmarks", "peer_reward.py")
WHEEL_TARGET = "/tmp/peer-verl"
# veRL's phases in its metrics (trainer/ppo/v1/trainer_base.py and trainer_sync.py of 0.9.1), as verlx names them
PHASES = ("gen", "update_weights", "reward", "old_log_prob", "ref", "adv", "update_actor")
ATTEMPTS = {  # name: (trainer.use_v1, actor_rollout_ref.model.use_remove_padding, token-budget micro-batches)
    "v1-rmpad": (True, True, True),
    "v0-rmpad": (False, True, True),
    "v1-padded": (True, False, True),
    "v1-padded-fixed": (True, False, False),
}
PROMPT_TOKENS = 64  # data.max_prompt_length of the throughput runs (and of peer_trl.py's)
FIXED_MICRO_BATCH_TOKENS = 16384  # the padded fixed micro-batches' tokens (prompt + response, every row padded)
CONSOLE_LINE = re.compile(r"(?:^|\) )step:(\d+) - (.*)$")
NUMBER = re.compile(r"^(?:np\.\w+\()?(-?(?:[\d.]+(?:e[-+]?\d+)?|nan|inf))\)?$")


def micro_batch(mini_batch_samples: int, sequence_tokens: int, tokens: int) -> int:
    """The most samples of `sequence_tokens` each within `tokens`: a power of two dividing the mini-batch."""
    size = 1
    while mini_batch_samples % (size * 2) == 0 and size * 2 * sequence_tokens <= tokens:
        size *= 2
    return size


def batching_overrides(attempt: str, budgets: dict, mini_batch_samples: int, sequence_tokens: int) -> list[str]:
    """veRL's micro-batching keys for an attempt: verlx's token budgets, or fixed micro-batches of padded rows
    (veRL's padded path keeps every row at prompt + response length, so a token budget would not bound it)."""
    if ATTEMPTS[attempt][2]:
        return ["actor_rollout_ref.actor.use_dynamic_bsz=True",
                f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budgets['actor_budget']}",
                f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={budgets['log_prob_budget']}"]
    micro = micro_batch(mini_batch_samples, sequence_tokens, FIXED_MICRO_BATCH_TOKENS)
    return ["actor_rollout_ref.actor.use_dynamic_bsz=False",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={micro}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={micro}"]


def verl_command(model_dir: str, data_dir: str, out_dir: str, args, budgets: dict, attempt: str) -> list[str]:
    """veRL's main_ppo command line for the run (see the module docstring for every choice)."""
    use_v1, remove_padding, _ = ATTEMPTS[attempt]
    prompts, n = args.prompts, args.n
    return [
        sys.executable, "-m", "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/test.parquet",
        f"data.train_batch_size={prompts}", "data.max_prompt_length=64",
        f"data.max_response_length={args.response_length}", "data.filter_overlong_prompts=False",
        "data.truncation=error",
        f"actor_rollout_ref.model.path={model_dir}",
        f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        "actor_rollout_ref.actor.optim.lr=1e-6", f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts // 2}",
        *batching_overrides(attempt, budgets, prompts // 2 * n, PROMPT_TOKENS + args.response_length),
        "actor_rollout_ref.actor.use_kl_loss=False", "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={n}", "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.ignore_eos=True", f"actor_rollout_ref.rollout.max_num_seqs={max(256, prompts * n)}",
        f"reward.custom_reward_function.path={REWARD_FILE}", "reward.custom_reward_function.name=compute_score",
        f"trainer.use_v1={use_v1}", "trainer.critic_warmup=0", "trainer.logger=[console,file]",
        "trainer.project_name=peer_verl", f"trainer.experiment_name={attempt}", "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1", f"trainer.total_training_steps={args.steps}", "trainer.total_epochs=1",
        "trainer.val_before_train=False", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.resume_mode=disable", f"trainer.default_local_dir={out_dir}/ckpt",
    ]


def _number(text: str) -> float | None:
    if text in ("True", "False"):
        return float(text == "True")
    match = NUMBER.match(text.strip())
    return float(match.group(1)) if match else None


def parse_verl_console(text: str) -> list[dict]:
    """veRL's console metric lines ("step:N - key:value - ...", numbers printed by pprint, numpy scalars as
    np.float64(x), behind Ray's "(TaskRunnerV1 pid=...)" prefix) → one dict per step, verlx's row layout."""
    rows = {}
    for line in text.splitlines():
        match = CONSOLE_LINE.search(line.strip())
        if match is None:
            continue
        row = {"step": int(match.group(1))}
        for part in match.group(2).split(" - "):
            key, sep, value = part.partition(":")
            number = _number(value) if sep else None
            if number is not None:
                row[key.strip()] = number
        rows[row["step"]] = {**rows.get(row["step"], {}), **row}
    return [rows[s] for s in sorted(rows)]


def read_verl_jsonl(path: str) -> list[dict]:
    """veRL's file logger (VERL_FILE_LOGGER_PATH): {"step": N, "data": {...}} per line."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [{"step": r["step"], **r["data"]} for r in records if "timing_s/step" in r["data"]]


def steady(rows: list[dict], key: str) -> float | None:
    """Mean of `key` over the steps after the first (compilation, graph capture, engine start)."""
    values = [r[key] for r in rows if r.get("step", 0) >= 2 and isinstance(r.get(key), (int, float))]
    return sum(values) / len(values) if values else None


def side_by_side(verlx_rows: list[dict], verl_rows: list[dict], samples_per_step: int) -> list[dict]:
    """Steady-state seconds per step and phase, and generated tokens per second (samples × mean response length
    / step seconds), of both systems."""
    table = []
    for key in ("timing_s/step", *(f"timing_s/{p}" for p in PHASES)):
        table.append({"metric": key, "verlx": steady(verlx_rows, key), "verl": steady(verl_rows, key)})
    rates = {}
    for name, rows in (("verlx", verlx_rows), ("verl", verl_rows)):
        step, length = steady(rows, "timing_s/step"), steady(rows, "response_length/mean")
        rates[name] = samples_per_step * length / step if step and length else None
    table.append({"metric": "generated tok/s", **rates})
    for row in table:
        a, b = row["verlx"], row["verl"]
        row["verl / verlx"] = b / a if a and b is not None else None
    return table


def print_side_by_side(table: list[dict]) -> None:
    print("\n| steady state (steps ≥ 2) | verlx | veRL 0.9.1 | veRL / verlx |\n|---|---|---|---|")
    for row in table:
        cells = [f"{row[k]:.4g}" if isinstance(row[k], float) else "-" for k in ("verlx", "verl", "verl / verlx")]
        print(f"| {row['metric']} | " + " | ".join(cells) + " |")


def install_wheels(wheel_dir: str, target: str = WHEEL_TARGET) -> str:
    """Install the carried wheels once per machine into `target` (veRL's process puts it first on its path)."""
    done = os.path.join(target, ".done")
    if not os.path.exists(done):
        wheels = [os.path.join(wheel_dir, w) for w in sorted(os.listdir(wheel_dir)) if w.endswith(".whl")]
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                        "--target", target, *wheels], check=True)
        with open(done, "w"):
            pass
    return target


def run_verl(args, model_dir: str, data_dir: str, work: str, budgets: dict) -> dict:
    """Each attempt in turn until one logs every step (with --all-attempts every attempt, the fastest steady step
    counting); what each did is kept."""
    env = {**os.environ, "VERL_LOGGING_LEVEL": "INFO"}
    if args.wheels:
        env["PYTHONPATH"] = os.pathsep.join([install_wheels(args.wheels), env.get("PYTHONPATH", "")])
    tried, best = [], None
    for attempt in args.verl_attempts.split(","):
        out_dir = os.path.join(work, f"verl-{attempt}")
        os.makedirs(out_dir, exist_ok=True)
        cmd = verl_command(model_dir, data_dir, out_dir, args, budgets, attempt)
        record = {"attempt": attempt, "command": " ".join(cmd)}
        tried.append(record)
        if args.smoke:
            record["result"] = "not run (--smoke)"
            print("veRL command: " + record["command"])
            continue
        jsonl = os.path.join(out_dir, "metrics.jsonl")
        log_path = os.path.join(os.environ.get("OUT") or work, f"verl-{attempt}.log")  # kept if the job is cut
        with open(log_path, "w") as log:
            try:
                rc = subprocess.run(cmd, cwd=out_dir, env={**env, "VERL_FILE_LOGGER_PATH": jsonl},
                                    timeout=args.timeout_s, stdout=log, stderr=subprocess.STDOUT).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        with open(log_path) as f:
            text = f.read()
        rows = read_verl_jsonl(jsonl) or parse_verl_console(text)
        record.update(rc=rc, steps=len(rows), log_tail=text.splitlines()[-25:])
        print(f"veRL attempt {attempt}: rc {rc}, {len(rows)} steps", flush=True)
        if len(rows) < args.steps:
            continue
        record["rows"] = rows
        if best is None or steady(rows, "timing_s/step") < steady(best["rows"], "timing_s/step"):
            best = record
        if not args.all_attempts:
            break
    return {"tried": tried, "rows": best["rows"] if best else [], "attempt": best["attempt"] if best else None}


# ------------------------------------------------------------------------------------- --learning: accuracy curves
def learning_args(args):
    """benchmarks/learning_gpu.py's settings for this run: the same data, SFT model and GRPO hyperparameters."""
    argv = ["--out", args.out, "--seed", str(args.seed), "--engine", "vllm", *(["--smoke"] if args.smoke else [])]
    return learning_gpu.parse_args(argv + (["--steps", str(args.steps)] if args.steps else []))


def learning_command(largs, p: dict, info: dict, out_dir: str, budgets: dict, attempt: str) -> list[str]:
    """veRL's main_ppo for learning_gpu's GRPO run: each of its hyperparameters under veRL's key (the module
    docstring says which veRL defaults it has to leave)."""
    use_v1, remove_padding, _ = ATTEMPTS[attempt]
    mini_batch_samples = largs.prompts // largs.updates_per_step * largs.n
    return [
        sys.executable, "-m", "verl.trainer.main_ppo",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False", "algorithm.norm_adv_by_std_in_grpo=True",
        f"data.train_files={p['data']}/rl_train.parquet", f"data.val_files={p['data']}/test.parquet",
        f"data.train_batch_size={largs.prompts}", f"data.max_prompt_length={info['max_prompt_tokens']}",
        f"data.max_response_length={largs.response_length}", "data.filter_overlong_prompts=False",
        "data.truncation=error", "data.shuffle=True", f"data.seed={largs.seed}",
        f"actor_rollout_ref.model.path={p['sft_model']}",
        f"actor_rollout_ref.model.use_remove_padding={remove_padding}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=False",
        "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
        f"actor_rollout_ref.actor.optim.lr={largs.lr}", "actor_rollout_ref.actor.optim.weight_decay=0.01",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={largs.prompts // largs.updates_per_step}",
        "actor_rollout_ref.actor.ppo_epochs=1", "actor_rollout_ref.actor.clip_ratio=0.2",
        "actor_rollout_ref.actor.grad_clip=1.0", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        "actor_rollout_ref.actor.entropy_coeff=0", "actor_rollout_ref.actor.use_kl_loss=False",
        *batching_overrides(attempt, budgets, mini_batch_samples, info["max_prompt_tokens"] + largs.response_length),
        "actor_rollout_ref.actor.fsdp_config.param_offload=False",
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=False",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        f"actor_rollout_ref.rollout.n={largs.n}", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_p=1.0", f"actor_rollout_ref.rollout.seed={largs.seed}",
        f"actor_rollout_ref.rollout.gpu_memory_utilization={largs.gpu_memory_utilization}",
        f"actor_rollout_ref.rollout.max_num_seqs={max(256, largs.prompts * largs.n)}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=False", "actor_rollout_ref.rollout.val_kwargs.temperature=0",
        f"reward.custom_reward_function.path={REWARD_FILE}", "reward.custom_reward_function.name=compute_score",
        f"trainer.use_v1={use_v1}", "trainer.critic_warmup=0", "trainer.logger=[console,file]",
        "trainer.project_name=learning_verl", f"trainer.experiment_name={attempt}-s{largs.seed}",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", f"trainer.total_training_steps={largs.steps}",
        "trainer.total_epochs=1000", "trainer.val_before_train=True", f"trainer.test_freq={largs.test_freq}",
        "trainer.save_freq=-1", "trainer.resume_mode=disable", f"trainer.default_local_dir={out_dir}/ckpt",
    ]


# veRL's held-out accuracy key: val-core/<data_source>/<acc, else reward>/mean@<n>. The data-source segment is
# whatever veRL's reward loop carried (the 2026-11-26 GPU run found no `val-core/arithmetic/...` key), so any
# data source is read, and the key veRL used is kept beside the value.
VERL_VAL_KEY = re.compile(r"^val-core/[^/]+/(acc|reward)/mean@\d+$")


def verl_jsonl_row(line: str) -> dict | None:
    """One line of veRL's file logger ({"step": N, "data": {...}}) as a verlx metrics row: the held-out accuracy
    under learning_gpu's key (the `acc` variable preferred, as veRL's own val-core choice)."""
    record = json.loads(line)
    if not isinstance(record.get("data"), dict):
        return None
    row = {"step": record["step"], **record["data"]}
    found = sorted((key for key in record["data"] if VERL_VAL_KEY.match(key)), key=lambda k: "/acc/" not in k)
    if found:
        row[learning_gpu.VAL_KEY] = record["data"][found[0]]
        row["verl_val_key"] = found[0]
    return row


def learning_budgets(runs_dir: str, seed: int) -> dict:
    """The token budgets verlx's workers chose in the vLLM run of this seed (else any verlx run); 16384 if none."""
    logs = sorted(glob.glob(os.path.join(runs_dir, "verlx-*", "run.log")),
                  key=lambda path: ("-vllm-1gpu-sync-" not in path, f"-s{seed}" not in path, path))
    for path in logs:
        with open(path, errors="replace") as f:
            decisions = grpo_step_gpu.auto_decisions(f.read())
        if decisions["actor_budget"]:
            return {k: decisions[k] or 16384 for k in ("actor_budget", "log_prob_budget")} | {"from": path}
    return {"actor_budget": 16384, "log_prob_budget": 16384, "from": None}


def run_learning(args) -> int:
    """veRL on learning_gpu's SFT model and data (built here when --out has none), each attempt in turn until one
    logs every validation; its summary has learning_gpu's layout (system "verl")."""
    largs = learning_args(args)
    p = learning_gpu.paths(os.path.abspath(largs.out))
    info = learning_gpu.stage_data(largs, p)
    learning_gpu.stage_sft(largs, p, info)
    budgets = learning_budgets(p["runs"], largs.seed)
    env = {**os.environ, "VERL_LOGGING_LEVEL": "INFO", "TOKENIZERS_PARALLELISM": "false"}
    if args.wheels:
        env["PYTHONPATH"] = os.pathsep.join([install_wheels(args.wheels), env.get("PYTHONPATH", "")])
    name = f"verl-vllm-1gpu-sync-s{largs.seed}"
    tried, summary = [], None
    for attempt in args.verl_attempts.split(","):
        out_dir = os.path.join(p["runs"], name, attempt)
        os.makedirs(out_dir, exist_ok=True)
        cmd = learning_command(largs, p, info, out_dir, budgets, attempt)
        record = {"attempt": attempt, "command": " ".join(cmd)}
        tried.append(record)
        print(f"veRL attempt {attempt}: {record['command']}", flush=True)
        if args.smoke:
            record["result"] = "not run (--smoke)"
            continue
        meta = {"name": name, "system": "verl", "engine": "vllm", "layout": "1gpu", "mode": "sync",
                "seed": largs.seed, "attempt": attempt, "rc": None, "wall_s": None, "command": record["command"],
                "budgets": budgets, "hyperparameters": learning_gpu.hyperparameters(largs),
                "samples_per_step": largs.prompts * largs.n, **learning_gpu.environment()}
        summary = run_verl_learning(args, cmd, env, out_dir, meta, p, largs.test_size)
        with open(os.path.join(out_dir, "run.log"), errors="replace") as f:
            record.update(rc=summary["rc"], log_tail=f.read().splitlines()[-25:])
        learning_gpu.export(f"verl-tried-s{largs.seed}.json", {"tried": tried, "budgets": budgets})
        if summary["steps"]:
            break  # it trained: a run cut by --timeout-s is a time limit, not a reason to try another attempt
        print(f"veRL attempt {attempt}: rc {summary['rc']}, validations {[c['step'] for c in summary['curve']]}\n"
              + "\n".join(record["log_tail"]), flush=True)
        summary = None
    learning_gpu.export(f"verl-tried-s{largs.seed}.json", {"tried": tried, "budgets": budgets})
    if summary is not None:
        learning_gpu.print_runs([summary])
    return 0 if summary is not None or args.smoke else 1


def run_verl_learning(args, cmd: list[str], env: dict, out_dir: str, meta: dict, p: dict, test_size: int) -> dict:
    """One veRL attempt, its summary rewritten as each metrics line appears (a run cut short keeps its curve)."""
    jsonl = os.path.join(out_dir, "metrics.jsonl")

    def save(timed_rows) -> dict:
        summary = learning_gpu.learning_summary(timed_rows, meta, test_size)
        learning_gpu.write_json(os.path.join(p["runs"], meta["name"], "summary.json"), summary)
        learning_gpu.export(f"{meta['name']}.json", summary)
        return summary

    result = learning_gpu.run_watched(cmd, out_dir, {**env, "VERL_FILE_LOGGER_PATH": jsonl},
                                      os.path.join(out_dir, "run.log"), jsonl, meta["name"], args.timeout_s,
                                      parse=verl_jsonl_row, on_rows=save)
    meta.update(rc=result["rc"], wall_s=result["wall_s"], stopped_at_limit=result["stopped_at_limit"])
    return save(result["timed_rows"])


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="0.5b", choices=list(grpo_step_gpu.SHAPES))
    p.add_argument("--steps", type=int, help="default: 3 (throughput), learning_gpu's 40 (--learning)")
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--n", type=int, default=4)
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--wheels", help="directory of the wheels benchmarks/peer_verl_wheels.sh downloaded")
    p.add_argument("--verl-attempts", default=",".join(ATTEMPTS), help=f"tried in order: {', '.join(ATTEMPTS)}")
    p.add_argument("--all-attempts", action="store_true", help="run every attempt; the fastest steady step counts")
    p.add_argument("--skip-verlx", action="store_true", help="veRL only (verlx measured beside it elsewhere; the "
                   "token-budget attempts then get 16384)")
    p.add_argument("--timeout-s", type=int, default=1500, help="per veRL attempt")
    p.add_argument("--smoke", action="store_true", help="CPU: verlx's side on the tiny shape; veRL's command printed")
    p.add_argument("--learning", action="store_true", help="veRL on benchmarks/learning_gpu.py's run: accuracy "
                   "curves (see the module docstring)")
    p.add_argument("--out", help="--learning: learning_gpu.py's --out (data and SFT model; built when absent)")
    p.add_argument("--seed", type=int, default=0, help="--learning: the run's seed")
    args = p.parse_args(argv)
    if args.learning and not args.out:
        p.error("--learning needs --out (benchmarks/learning_gpu.py's directory)")
    if args.smoke and not args.learning:
        grpo_step_gpu.apply_smoke(args)
    elif args.steps is None and not args.learning:
        args.steps = 3
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.learning:
        return run_learning(args)
    work = tempfile.mkdtemp(prefix="verlx-peer-")
    model_dir, data_dir = grpo_step_gpu.prepare_inputs(work, args.shape)
    verlx_args = grpo_step_gpu.parse_args([
        "--shape", args.shape, "--steps", str(args.steps), "--prompts", str(args.prompts), "--n", str(args.n),
        "--response-length", str(args.response_length), "--ignore-eos", *(["--smoke"] if args.smoke else []),
        "--extra", "actor_rollout_ref.actor.use_kl_loss=false", f"custom_reward_function.path={REWARD_FILE}"])
    verlx = {"rows": [], "rc": 0, "decisions": {}}
    if not args.skip_verlx:
        verlx = grpo_step_gpu.run_once(verlx_args, model_dir, data_dir, work, "verlx", dict(os.environ))
    decisions = verlx["decisions"]
    budgets = {k: decisions.get(k) or 16384 for k in ("actor_budget", "log_prob_budget")}
    if not decisions.get("actor_budget"):
        print("verlx's token budgets were not found in its log: veRL gets 16384 (the issue's tuned value)")
    verl = run_verl(args, model_dir, data_dir, work, budgets)
    if verl["rows"]:
        grpo_step_gpu.print_rows(verl["rows"], f"veRL ({verl['attempt']}): ")
    else:
        for record in verl["tried"]:
            print(f"\nveRL attempt {record['attempt']}: {record.get('result') or 'rc ' + str(record.get('rc'))}")
            print("\n".join(record.get("log_tail", [])))
    table = side_by_side(verlx["rows"], verl["rows"], args.prompts * args.n)
    print_side_by_side(table)
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "peer_verl.json"), "w") as f:
            json.dump({"args": vars(args), "budgets": budgets, "verlx": verlx["rows"], "verlx_decisions": decisions,
                       "verl": verl, "side_by_side": table}, f, indent=1)
    return verlx["rc"] or (0 if verl["rows"] or args.smoke else 1)


if __name__ == "__main__":
    sys.exit(main())
