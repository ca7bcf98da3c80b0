"""Every engine through verlx on one GPU: GPU tests, GRPO through main_ppo (with and without offload), main_generation.

  python benchmarks/engines_gpu.py tests generation grpo grpo-offload --engines native,sglang,vllm \\
      --engine-path sglang=/tmp/engine-sglang --engine-path vllm=/tmp/engine-vllm

Each engine runs in its own processes with only its own bundle on PYTHONPATH (SGLang and vLLM pin different
packages). Stages:
  tests         tests/gpu/test_<engine>_gpu.py, one process per sleep level
  generation    main_generation of 512 GSM8K-schema prompts x 4 samples (0.5B shape, random weights)
  grpo          benchmarks/grpo_step_gpu.py: 0.5B shape, 64 prompts x 4 samples, 256 tokens, 3 steps, no KL
  grpo-offload  the same with actor param + optimizer offload
Full logs go to $OUT/<stage>_<engine>.log; a summary table per stage is printed as it completes.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine_env import engine_env  # noqa: E402

GRPO = ["--steps", "3", "--n", "4", "--prompts", "64", "--response-length", "256"]
NO_KL = "actor_rollout_ref.actor.use_kl_loss=false"
OFFLOAD = ["actor_rollout_ref.actor.fsdp_config.param_offload=true",
           "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true"]
GRPO_SHOWN = ("timing_s/step", "timing_s/gen", "timing_s/update_weights", "timing_s/old_log_prob",
              "timing_s/update_actor", "perf/max_memory_allocated_gb", "perf/max_memory_allocated_gb/gen",
              "rollout/engine_asleep_gb", "rollout/logprob_diff", "rollout/logprob_diff_max", "response_length/mean")


LOG_DIR = os.environ.get("OUT") or tempfile.mkdtemp(prefix="verlx-engines-")


def _out(name: str) -> str:
    return os.path.join(LOG_DIR, name)


def _run(label: str, cmd: list[str], env: dict, timeout: float) -> tuple[int, float, str]:
    start = time.perf_counter()
    log = _out(f"{label}.log")
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = 124
    with open(log, errors="replace") as f:
        text = f.read()
    return rc, time.perf_counter() - start, text


def _tail(text: str, n: int = 12) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip() and "it/s]" not in ln and "Capturing" not in ln]
    return "\n".join(lines[-n:])


def stage_tests(args, paths) -> None:
    print("\n## GPU tests", flush=True)
    for engine in args.engines:
        if engine == "native":
            targets = {"all": "tests/unit/test_native_engine_gpu.py"}
        else:
            targets = {f"level{level}": f"tests/gpu/test_{engine}_gpu.py::test_weights_pushed_while_asleep_take_effect"
                                        f"[{level}]" for level in (1, 2)}
        for label, target in targets.items():
            rc, seconds, text = _run(f"tests_{engine}_{label}",
                                     [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", target],
                                     engine_env(engine, paths, ROOT), args.timeout_s)
            summary = [ln for ln in text.splitlines()
                       if any(w in ln for w in (" passed", " failed", " skipped", "error"))][-1:]
            print(f"- {engine} {target}: rc {rc}, {seconds:.0f} s, {summary[0] if summary else '?'}", flush=True)
            if rc:
                print(_tail(text, 25), flush=True)


def _grpo_rows(metrics_file: str) -> list[dict]:
    return [json.loads(line) for line in open(metrics_file)] if os.path.exists(metrics_file) else []


def stage_grpo(args, paths, offload: bool) -> None:
    name = "grpo-offload" if offload else "grpo"
    print(f"\n## {name}: " + " ".join(GRPO) + (" + param/optimizer offload" if offload else ""), flush=True)
    print("| engine | step | " + " | ".join(k.split("/", 1)[1] for k in GRPO_SHOWN) + " |", flush=True)
    print("|---" * (len(GRPO_SHOWN) + 2) + "|", flush=True)
    for engine in args.engines:
        out_dir = tempfile.mkdtemp(prefix=f"verlx-{name}-{engine}-")  # grpo_step_gpu copies its metrics to $OUT
        cmd = [sys.executable, "benchmarks/grpo_step_gpu.py", "--engine", engine, *GRPO, "--extra", NO_KL,
               *(OFFLOAD if offload else [])]
        rc, seconds, text = _run(f"{name}_{engine}", cmd, engine_env(engine, paths, ROOT, OUT=out_dir), args.timeout_s)
        rows = _grpo_rows(os.path.join(out_dir, "grpo_metrics.jsonl"))
        for row in rows:
            cells = [f"{row[k]:.3g}" if isinstance(row.get(k), (int, float)) else "-" for k in GRPO_SHOWN]
            print(f"| {engine} | {row['step']} | " + " | ".join(cells) + " |", flush=True)
        if rc or len(rows) < 3:
            print(f"| {engine} | FAILED rc {rc} after {seconds:.0f} s |\n{_tail(text, 25)}", flush=True)


def _generation_inputs(work: str) -> tuple[str, str]:
    import grpo_step_gpu

    model, data = os.path.join(work, "model"), os.path.join(work, "data")
    if not os.path.isdir(model):
        grpo_step_gpu.build_model(model, "0.5b")
        subprocess.run([sys.executable, os.path.join(ROOT, "examples/data_preprocess/arithmetic.py"),
                        "--local_save_dir", data, "--test_size", "512"], check=True, capture_output=True)
    return model, os.path.join(data, "test.parquet")


def stage_generation(args, paths) -> None:
    import pyarrow.parquet as pq

    print("\n## main_generation: 512 prompts x 4 samples, 256 tokens, T=1 (0.5B shape, random weights)", flush=True)
    model, data = _generation_inputs(os.path.join(tempfile.gettempdir(), "verlx-engines-gen"))
    for engine in args.engines:
        output = _out(f"generations_{engine}.parquet")
        cmd = [sys.executable, "-m", "verlx.trainer.main_generation", f"data.path={data}", f"model.path={model}",
               f"data.output_path={output}", "data.n_samples=4", "data.batch_size=512", f"rollout.name={engine}",
               "rollout.temperature=1.0", "rollout.response_length=256", "rollout.prompt_length=128",
               "rollout.gpu_memory_utilization=0.5", "trainer.n_gpus_per_node=1"]
        rc, seconds, text = _run(f"generation_{engine}", cmd, engine_env(engine, paths, ROOT), args.timeout_s)
        if rc or not os.path.exists(output):
            print(f"- {engine}: FAILED rc {rc} after {seconds:.0f} s\n{_tail(text, 25)}", flush=True)
            continue
        table = pq.read_table(output)
        responses = table.column("responses").to_pylist()
        counts = {len(r) for r in responses}
        mean_chars = sum(map(len, sum(responses, []))) / (4 * len(responses))
        print(f"- {engine}: rc 0, {seconds:.0f} s wall (start-up included), {table.num_rows} rows, responses per "
              f"row {sorted(counts)}, mean response chars {mean_chars:.0f}", flush=True)
        os.remove(output)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("stages", nargs="+", choices=["tests", "generation", "grpo", "grpo-offload"])
    p.add_argument("--engines", default="native,sglang,vllm", type=lambda s: s.split(","))
    p.add_argument("--engine-path", action="append", default=[], metavar="ENGINE=DIR")
    p.add_argument("--timeout-s", type=float, default=420)
    args = p.parse_args()
    paths = dict(item.split("=", 1) for item in args.engine_path)
    missing = [d for d in paths.values() if not glob.glob(os.path.join(d, "*"))]
    if missing:
        sys.exit(f"engine bundles not unpacked: {missing} (source .engines/<engine>/install.sh first)")
    stages = {"tests": stage_tests, "generation": stage_generation,
              "grpo": lambda a, p: stage_grpo(a, p, offload=False),
              "grpo-offload": lambda a, p: stage_grpo(a, p, offload=True)}
    for stage in args.stages:
        stages[stage](args, paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
