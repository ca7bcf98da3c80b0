"""veRL's 2026-01 example scripts that train a model of at most 8B on GSM8K or MATH, one training step each on the
CPU, with verlx's tiny model and real GSM8K rows standing in for theirs. The scripts are read from a veRL checkout
at run time (extracted into a temporary directory as benchmarks/verl_scripts.py does; nothing of veRL is stored).

Every key of the script is kept as written, then these are appended (the last value wins): the data files (GSM8K,
from /work/shared/data/gsm8k or --gsm8k), the model, critic and tokenizer (verlx.models.tiny), short prompts and
responses, 4 prompts per step (generated 4 at a time) in mini-batches of 2 with micro-batches of 1, 2 CPU worker
processes on one node (the script's Ulysses size when larger), the native rollout engine (vLLM and SGLang need a
GPU) with tensor parallel size 1, one step, no validation, no checkpoint. A script passes when main_ppo exits 0
after its step. Each run starts a Ray of its own (a private RAY_TMPDIR, no RAY_ADDRESS).

    python benchmarks/verl_scripts_cpu_step.py --limit 30 --out /tmp/cpu_steps.json     # the 2026-01 mirror
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

from verl_scripts import SETS, as_command
from verl_scripts_extract import Source, extract, submodule_commit

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [REPO, os.path.join(REPO, "tests"), os.path.dirname(os.path.abspath(__file__))]

SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*[bB](?![a-zA-Z])")
MAX_BILLIONS = 8.0


def stand_ins(directory: str, gsm8k: str) -> dict[str, str]:
    """The tiny model and the GSM8K parquet files."""
    model = os.path.join(directory, "model")
    data = os.path.join(directory, "gsm8k")
    subprocess.run([sys.executable, "-m", "verlx.models.tiny", "--output_dir", model], check=True, cwd=REPO,
                   capture_output=True)
    subprocess.run([sys.executable, os.path.join(REPO, "examples/data_preprocess/gsm8k.py"), "--local_dataset_path",
                    gsm8k, "--local_save_dir", data], check=True, cwd=REPO, capture_output=True)
    return {"model": model, "train": os.path.join(data, "train.parquet"), "test": os.path.join(data, "test.parquet")}


def step_overrides(paths: dict[str, str], out_dir: str, argv: list[str]) -> list[str]:
    """The stand-ins and the scaled-down sizes; the workers are 2, or the script's Ulysses group if larger."""
    ulysses = max([int(a.split("=", 1)[1]) for a in argv if a.split("=")[0].endswith("ulysses_sequence_parallel_size")
                   and a.split("=", 1)[1].isdigit()] or [1])
    tokenizers = [f"{a.split('=')[0]}={paths['model']}" for a in argv if a.split("=")[0].endswith(".tokenizer_path")]
    return [*tokenizers, f"critic.model.path={paths['model']}",
        f"data.train_files={paths['train']}", f"data.val_files={paths['test']}", "data.train_batch_size=4",
        "data.gen_batch_size=4",
        "data.max_prompt_length=512", "data.max_response_length=16", "data.truncation=left",
        "data.filter_overlong_prompts=false", "data.train_max_samples=64", "data.val_max_samples=8",
        f"actor_rollout_ref.model.path={paths['model']}", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "++actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
        "++actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
        "++actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "++critic.ppo_micro_batch_size_per_gpu=1",
        "critic.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.name=native",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={max(2, ulysses)}",
        "trainer.device=cpu", "trainer.total_training_steps=1", "trainer.val_before_train=false",
        "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[console]", "trainer.progress_bar=false",
        f"trainer.output_dir={out_dir}/out", f"trainer.default_local_dir={out_dir}/ckpt", "trainer.resume_mode=disable",
    ]


def candidates(commands: list, limit: int, only: str | None = None) -> list:
    """Scripts whose command composes and passes preflight, on GSM8K or MATH, with a model of at most 8B."""
    from helpers.launch_commands import kind_of, make_fixtures, run_command

    chosen = []
    with tempfile.TemporaryDirectory() as tmp:
        fixtures = make_fixtures(tmp)
        for command in commands:
            text = " ".join(command.argv)
            model = next((a.split("=", 1)[1] for a in command.argv if a.startswith("actor_rollout_ref.model.path=")),
                         "")
            size = SIZE.search(model)
            if kind_of(command) != "ppo" or not re.search(r"gsm8k|math", text, re.I) or "megatron" in text:
                continue
            if size is None or float(size.group(1)) > MAX_BILLIONS or "custom_reward_function.path" in text:
                continue  # (a script's own reward function calls servers of its own)
            if only and not re.search(only, command.label):
                continue
            if run_command(command, fixtures).status == "pass":
                chosen.append(command)
            if len(chosen) == limit:
                break
    return chosen


def run_one(command, paths: dict[str, str], timeout: int) -> dict:
    from helpers.launch_commands import Fixtures, overrides_of

    with tempfile.TemporaryDirectory() as out_dir, tempfile.TemporaryDirectory(prefix="rx", dir="/tmp") as ray_tmp:
        overrides = overrides_of(command, Fixtures(out_dir, paths["train"], paths["model"], ""))
        cmd = [sys.executable, "-m", "verlx.trainer.main_ppo", *overrides, *step_overrides(paths, out_dir, overrides)]
        # a Ray of its own: ray.init without an address joins the cluster a `ray start` on this machine recorded in
        # <temp>/ray/ray_current_cluster (or RAY_ADDRESS); a private temp directory has none
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(PYTHONPATH=REPO, HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", RAY_TMPDIR=ray_tmp)
        start = time.perf_counter()
        try:
            result = subprocess.run(cmd, cwd=out_dir, env=env, capture_output=True, text=True, timeout=timeout)
            rc, tail = result.returncode, (result.stdout + result.stderr)[-1500:]
        except subprocess.TimeoutExpired:
            rc, tail = 124, f"timed out after {timeout} s"
    return {"script": command.label, "rc": rc, "seconds": round(time.perf_counter() - start, 1),
            "tail": "" if rc == 0 else tail}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=30)
    parser.add_argument("--only", help="a regex of script paths to run")
    parser.add_argument("--gsm8k", default="/work/shared/data/gsm8k")
    parser.add_argument("--timeout", type=int, default=900)
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "verl_scripts_cpu_step.json"))
    parser.add_argument("--set", default="2026-01", choices=sorted(SETS), help="the veRL checkout (local mirror)")
    args = parser.parse_args()
    verl, recipe_git = SETS[args.set]
    with tempfile.TemporaryDirectory() as tmp:
        root, extracted, _ = extract(verl, Source(recipe_git, submodule_commit(verl)), tmp, args.only)
        chosen = candidates([as_command(c, root, args.set) for c in extracted], args.limit, args.only)
        print(f"{len(chosen)} scripts", flush=True)
        paths = stand_ins(tmp, args.gsm8k)
        results = []
        for command in chosen:
            results.append(run_one(command, paths, args.timeout))
            r = results[-1]
            print(f"{'ok ' if r['rc'] == 0 else 'FAIL'} {r['seconds']:7.1f}s  {r['script']}", flush=True)
            if r["rc"]:
                print("    " + r["tail"].replace("\n", "\n    ")[-800:], flush=True)
    passed = sum(r["rc"] == 0 for r in results)
    print(f"{passed}/{len(results)} ran their step, {sum(r['seconds'] for r in results):.0f} s in all")
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
