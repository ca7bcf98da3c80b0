"""GRPO through main_ppo on one GPU: a Qwen2.5-0.5B-shaped model (random weights), a few steps, timing breakdown.

Builds the model (bf16 safetensors, Qwen's 151936-token vocabulary) with the quick-start's byte-level tokenizer (ids
the tokenizer does not know decode to nothing), writes arithmetic prompts in the GSM8K schema, runs
`verlx.trainer.main_ppo` with the native engine and prints each step's phase timings from the metrics JSONL (also
copied to $OUT). Random weights rarely emit EOS, so responses run to max_response_length (--ignore-eos makes sure).

By default the run sets no micro-batch size, token budget or checkpointing flag: the workers decide them (the
decisions are printed from the log); `--micro-batches fixed` passes the example scripts' former fixed micro-batch
sizes instead (the 2026-11-23 "example defaults" row).

  python benchmarks/grpo_step_gpu.py --steps 3 --n 4 --extra actor_rollout_ref.actor.use_kl_loss=false
  python benchmarks/grpo_step_gpu.py ... --profile actor,actor_infer   # step 2's phases traced (workers/profiling)
  python benchmarks/grpo_step_gpu.py ... --repeat-run                  # step 1 with a cold and a warm compile cache
  python benchmarks/grpo_step_gpu.py --smoke                           # CPU, tiny shape: the pipeline runs
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

SHAPES = {
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, vocab_size=151936),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, vocab_size=151936),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, vocab_size=152064, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, vocab_size=151936),
}
SHOWN = ("timing_s/step", "timing_s/gen", "timing_s/wake_weights", "timing_s/update_weights", "timing_s/wake_kv_cache",
         "timing_s/generate_engine", "timing_s/engine_sleep", "timing_s/reward", "timing_s/old_log_prob",
         "timing_s/ref", "timing_s/adv", "timing_s/update_actor", "perf/throughput", "perf/max_memory_allocated_gb",
         "perf/max_memory_allocated_gb/gen", "perf/mfu/actor", "response_length/mean", "rollout/logprob_diff",
         "rollout/engine_asleep_gb", "perf/device_memory_used_gb/gen", "perf/device_memory_imbalance/gen",
         "perf/device_memory_used_gb/actor", "perf/device_memory_imbalance/actor", "actor/entropy", "actor/pg_loss",
         "timing_s/teacher", "distillation/loss", "distillation/abs_loss")
AUTO_BUDGETS = {key: re.compile(rf"actor_rollout_ref\.{name}[^→\n]*→ (\d+)")
                for key, name in (("actor_budget", r"actor\.ppo_max_token_len_per_gpu"),
                                  ("log_prob_budget", r"rollout\.log_prob_max_token_len_per_gpu"))}
PROFILE_SHOWN = ("wall_s", "device_busy_s", "device_idle_s", "device_busy_fraction", "micro_batches",
                 "host_syncs_per_micro_batch", "sync_ops_per_micro_batch", "compiled_graphs")


def build_model(out_dir: str, shape: str, seed: int = 0) -> None:
    """The random-weight checkpoint, initialised on a GPU where there is one (a 7B model takes minutes on the
    CPU), in a process of its own so that no CUDA memory stays held beside the runs that follow."""
    import torch

    if not torch.cuda.is_available():  # NVML only: no CUDA context here
        build_model_on(out_dir, shape, "cpu", seed)
        return
    code = f"import grpo_step_gpu; grpo_step_gpu.build_model_on({out_dir!r}, {shape!r}, 'cuda', {seed})"
    subprocess.run([sys.executable, "-c", code], cwd=os.path.dirname(os.path.abspath(__file__)), check=True)


def build_model_on(out_dir: str, shape: str, device: str, seed: int = 0) -> None:
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from verlx.models.tiny import build_tokenizer

    tokenizer = build_tokenizer(model_max_length=4096)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = Qwen2Config(**{"tie_word_embeddings": True, **SHAPES[shape]}, max_position_embeddings=32768,
                         rope_theta=1000000.0, eos_token_id=im_end, pad_token_id=tokenizer.pad_token_id,
                         dtype="bfloat16")
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)  # 7B in fp32 would take 30 GB
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(torch.float32)
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    GenerationConfig(eos_token_id=[im_end, tokenizer.eos_token_id],
                     pad_token_id=tokenizer.pad_token_id).save_pretrained(out_dir)


def prepare_inputs(work: str, shape: str, teacher_shape: str = "") -> tuple[str, str]:
    """The random-weight checkpoint (and the teacher's, a second seed, for --teacher-shape) and the arithmetic
    parquet files (both systems of a comparison read them)."""
    model_dir, data_dir = os.path.join(work, "model"), os.path.join(work, "data")
    build_model(model_dir, shape)
    if teacher_shape:
        build_model(os.path.join(work, "teacher"), teacher_shape, seed=1)
    subprocess.run([sys.executable, os.path.join(ROOT, "examples/data_preprocess/arithmetic.py"),
                    "--local_save_dir", data_dir, "--test_size", "256"], check=True)
    return model_dir, data_dir


def verlx_overrides(args, model_dir: str, data_dir: str, out_dir: str, teacher_dir: str | None = None) -> list[str]:
    """main_ppo's overrides for the run; with `teacher_dir`, on-policy distillation from that checkpoint."""
    per_gpu = args.prompts * args.n // args.gpus
    overrides = [
        "algorithm.adv_estimator=grpo", f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet", f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=64", f"data.max_response_length={args.response_length}",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={args.prompts // 2}",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.rollout.name={args.engine}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        f"trainer.n_gpus_per_node={args.gpus}", f"trainer.total_training_steps={args.steps}",
        "trainer.val_before_train=false", "trainer.logger=[console,file]", f"trainer.output_dir={out_dir}",
        f"trainer.default_local_dir={out_dir}/ckpt", "trainer.progress_bar=false",
    ]
    if args.micro_batches == "fixed":  # the example scripts' sizes before the workers sized micro-batches
        overrides += [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={min(16, per_gpu // 2)}",
                      f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={min(32, per_gpu)}",
                      f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={min(32, per_gpu)}",
                      "actor_rollout_ref.model.enable_gradient_checkpointing=true"]
    if args.ignore_eos:
        overrides.append("actor_rollout_ref.rollout.ignore_eos=true")
    if args.smoke:
        overrides += ["trainer.device=cpu", "reward.num_workers=0"]
    if teacher_dir:  # veRL's on-policy distillation example's loss settings, the task reward kept
        overrides += ["distillation.enabled=true",
                      f"distillation.teacher_models.teacher_model.model_path={teacher_dir}",
                      "distillation.distillation_loss.loss_mode=k1",
                      "distillation.distillation_loss.use_policy_gradient=true"]
    return [*overrides, *args.extra]


def run_logged(cmd: list[str], env: dict, log_path: str) -> int:
    """Run `cmd`, echoing its output and keeping a copy in `log_path`."""
    with open(log_path, "w") as log, subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                      stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
    return proc.returncode


def read_rows(metrics_path: str) -> list[dict]:
    if not os.path.exists(metrics_path):
        return []
    with open(metrics_path) as f:
        return [json.loads(line) for line in f]


def print_rows(rows: list[dict], label: str = "") -> None:
    print(f"\n{label}| step | " + " | ".join(k.split("/", 1)[1] for k in SHOWN) + " |")
    print("|---" * (len(SHOWN) + 1) + "|")
    for row in rows:
        cells = [f"{row[k]:.3g}" if isinstance(row.get(k), (int, float)) else "-" for k in SHOWN]
        print(f"| {row['step']} | " + " | ".join(cells) + " |")


def auto_decisions(log_text: str) -> dict:
    """The workers' automatic choices from a run's log: the lines, and the actor's training and log-prob budgets."""
    lines = sorted({line.split("actor: ", 1)[1].strip() for line in log_text.splitlines() if "actor: " in line
                    and "auto →" in line})
    found = {key: pattern.search(log_text) for key, pattern in AUTO_BUDGETS.items()}
    return {"lines": lines, **{key: int(m.group(1)) if m else None for key, m in found.items()}}


def load_json(path: str):
    with open(path) as f:
        return json.load(f)


def profile_table(directory: str) -> list[dict]:
    """The phase profiles' summaries (workers/profiling.py), printed as a table."""
    summaries = [load_json(p) for p in sorted(glob.glob(os.path.join(directory, "*_summary.json")))]
    if summaries:
        print("\n| phase (call, rank) | " + " | ".join(PROFILE_SHOWN) + " | allocator calls (s) | top kernel |")
        print("|---" * (len(PROFILE_SHOWN) + 3) + "|")
    for s in summaries:
        cells = [f"{s[k]:.3g}" if isinstance(s.get(k), float) else str(s.get(k)) for k in PROFILE_SHOWN]
        allocator = f"{sum(s['allocator_calls'].values())} ({sum(s['allocator_s'].values()):.3f})"
        top = s["top_kernels_s"][0][0][:40] if s["top_kernels_s"] else "-"
        print(f"| {s['phase']} ({s['call']}, {s['rank']}) | " + " | ".join(cells) + f" | {allocator} | {top} |")
    return summaries


def run_once(args, model_dir: str, data_dir: str, work: str, name: str, env: dict) -> dict:
    out_dir = os.path.join(work, name)
    teacher_dir = os.path.join(work, "teacher") if args.teacher_shape else None
    cmd = [sys.executable, "-m", "verlx.trainer.main_ppo",
           *verlx_overrides(args, model_dir, data_dir, out_dir, teacher_dir)]
    log_path = os.path.join(work, f"{name}.log")
    rc = run_logged(cmd, env, log_path)
    rows = read_rows(os.path.join(out_dir, "metrics.jsonl"))
    with open(log_path) as f:
        decisions = auto_decisions(f.read())
    print_rows(rows, f"{name}: ")
    for line in decisions["lines"]:
        print(f"auto: {line}")
    return {"rc": rc, "rows": rows, "decisions": decisions, "metrics_path": os.path.join(out_dir, "metrics.jsonl")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="0.5b", choices=list(SHAPES))
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=64, help="data.train_batch_size")
    p.add_argument("--n", type=int, default=8, help="actor_rollout_ref.rollout.n")
    p.add_argument("--response-length", type=int, default=256)
    p.add_argument("--engine", default="native")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--micro-batches", choices=("auto", "fixed"), default="auto")
    p.add_argument("--ignore-eos", action="store_true", help="force every response to --response-length")
    p.add_argument("--profile", default="", help="phases to trace in step 2, e.g. actor,actor_infer,gen")
    p.add_argument("--repeat-run", action="store_true", help="run twice on one fresh compile cache: cold, then warm")
    p.add_argument("--smoke", action="store_true", help="CPU, tiny shape, 2 steps of 4 prompts × 2")
    p.add_argument("--teacher-shape", default="", choices=["", *SHAPES],
                   help="on-policy distillation from a random teacher of this shape (its own seed)")
    p.add_argument("--extra", nargs="*", default=[], help="more key=value overrides")
    args = p.parse_args(argv)
    if args.smoke:
        apply_smoke(args)
    return args


def apply_smoke(args) -> None:
    """--smoke's run (also peer_verl's): the tiny shape, 2 steps of 4 prompts × 2 samples, 8 response tokens."""
    args.shape, args.steps, args.prompts, args.n, args.response_length = "tiny", 2, 4, 2, 8


def main(argv=None) -> int:
    args = parse_args(argv)
    work = tempfile.mkdtemp(prefix="verlx-grpo-")
    model_dir, data_dir = prepare_inputs(work, args.shape, args.teacher_shape)
    out = os.environ.get("OUT")
    env = {**os.environ}
    profile_dir = os.path.join(out or work, "profile")
    if args.profile:
        env.update(VERLX_PROFILE_DIR=profile_dir, VERLX_PROFILE_PHASES=args.profile,
                   VERLX_PROFILE_CALLS=str(min(2, args.steps)))
    cache = os.path.join(work, "compile_cache")
    if args.repeat_run:
        args.extra = [*args.extra, f"trainer.compile_cache_dir={cache}"]
    runs = {name: run_once(args, model_dir, data_dir, work, name, env)
            for name in (("cold_cache", "warm_cache") if args.repeat_run else ("run",))}
    if args.repeat_run:
        firsts = {name: r["rows"][0].get("timing_s/step") if r["rows"] else None for name, r in runs.items()}
        print(f"\nstep 1: {firsts['cold_cache']} s with an empty compile cache, {firsts['warm_cache']} s with the "
              "cache the first run filled")
    if args.profile:
        profile_table(profile_dir)
    if out:
        for name, r in runs.items():
            if r["rows"]:
                shutil.copy(r["metrics_path"], os.path.join(out, "grpo_metrics.jsonl" if name == "run"
                                                            else f"grpo_metrics_{name}.jsonl"))
        with open(os.path.join(out, "grpo_decisions.json"), "w") as f:
            json.dump({name: r["decisions"] for name, r in runs.items()}, f, indent=1)
    return max(r["rc"] for r in runs.values())


if __name__ == "__main__":
    sys.exit(main())
