"""`python -m verlx.quickstart [--seed S]`: the embedded default, end to end on a laptop-class CPU.

1. build a tiny Qwen2-architecture model and its tokenizer (save_pretrained),
2. write a synthetic set of two-digit sums (GSM8K schema), worked column by column ("57+68=?" → "7+8=15, 5+6+1=12,
   #### 125"): train, a validation split for SFT and a test split that no training decision ever sees. The
   training demonstrations come from a sloppy teacher that forgets most carries ("7+8=15, 5+6=11, #### 115";
   examples/data_preprocess/arithmetic.py --carry_slip); the ground truth is always right,
3. fine-tune the model on the demonstrations for a fixed number of steps (SFT, main_sft's defaults): it learns to
   add, and to forget most carries, so it is right on the sums without a carry and wrong on most others,
4. train it with GRPO through main_ppo (2 CPU workers, the native rollout engine), rewarded for right sums only,
   validating greedily on the held-out sums before training and along the way: it learns to carry,
5. export the trained actor as a Hugging Face model directory (`grpo_model`), print held-out accuracy before and
   after with its standard error, and draw the training curves.

--seed seeds all of it: the data split and the teacher's slips, the model's initialisation, SFT and GRPO. Each
stage is the ordinary command a user would run (printed before it runs); stages whose output exists are skipped, so
an interrupted quick start resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

PYTHON = sys.executable
CARRY_SLIP = 0.7  # the teacher forgets the carry this often: SFT samples a carried sum ~30% of the time
CLAIMED_GAIN = 0.15  # what the quick start shows: at least 15 points of held-out accuracy
ACCURACY_KEY, ERROR_KEY = "val-core/arithmetic/reward/mean@1", "val-aux/arithmetic/reward/sem@1"


def run(cmd: list[str], env: dict | None = None) -> None:
    print("\n$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def val_accuracy(metrics_path: str) -> list[tuple[int, float, float]]:
    """(step, held-out accuracy, its standard error) for every validation the run logged."""
    points = []
    with open(metrics_path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if ACCURACY_KEY in row:
                points.append((int(row["step"]), float(row[ACCURACY_KEY]), float(row.get(ERROR_KEY, math.nan))))
    return points


def rows_to_resolve(gain: float) -> int:
    """Test rows for which two standard errors of a before/after difference stay below `gain` at worst (both
    accuracies at 50%, their errors independent): 2 * sqrt(2 * 0.25 / n) <= gain."""
    return math.ceil(2.0 / gain**2)


def small_test_split_warning(test_size: int, gain: float = CLAIMED_GAIN) -> str | None:
    """Why a test split of `test_size` rows cannot show `gain`, or None when it can."""
    needed = rows_to_resolve(gain)
    if test_size >= needed:
        return None
    return (f"--test_size {test_size} is too small to measure a {gain:.0%} gain: two standard errors of the "
            f"before/after difference can reach {200 * math.sqrt(0.5 / max(test_size, 1)):.0f} points; use at "
            f"least {needed} rows")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verlx.quickstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", default="runs/quickstart")
    p.add_argument("--seed", type=int, default=0, help="seed of the data, the model's initialisation, SFT and GRPO")
    p.add_argument("--rl_steps", type=int, default=20)
    p.add_argument("--test_size", type=int, default=500, help="held-out sums for the before/after accuracy")
    p.add_argument("--workers", type=int, default=2, help="CPU worker processes (trainer.n_gpus_per_node)")
    args, extra = p.parse_known_args(argv)
    out = os.path.abspath(args.output_dir)
    _claim_output_dir(out, {"seed": args.seed, "test_size": args.test_size})
    warning = small_test_split_warning(args.test_size)
    if warning:
        print(f"warning: {warning}", flush=True)
    model, data, sft, rl, rl_model = (os.path.join(out, d) for d in ("model", "data", "sft_model", "grpo",
                                                                     "grpo_model"))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}
    start = time.time()

    if not os.path.exists(os.path.join(model, "config.json")):
        run([PYTHON, "-m", "verlx.models.tiny", "--output_dir", model, "--seed", str(args.seed)], env)
    if not os.path.exists(os.path.join(data, "test.parquet")):
        run([PYTHON, os.path.join(_examples(), "arithmetic.py"), "--local_save_dir", data, "--min_operand", "10",
             "--max_operand", "99", "--test_size", str(args.test_size), "--val_size", "250", "--chain_of_thought",
             "--carry_slip", str(CARRY_SLIP), "--seed", str(args.seed)], env)
    if not os.path.exists(os.path.join(sft, "config.json")):
        run([PYTHON, "-m", "verlx.trainer.main_sft", f"data.train_files={data}/train.parquet",
             f"data.val_files={data}/val.parquet", f"model.partial_pretrain={model}",
             f"trainer.seed={args.seed}",
             f"trainer.default_local_dir={sft}", f"trainer.output_dir={out}/sft_logs"], env)
    metrics = os.path.join(rl, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)  # a re-run trains afresh (resume_mode=disable) and starts its curve afresh
    run(_grpo_command(args, data, sft, rl, out, extra), env)
    run([PYTHON, "-m", "verlx.model_merger", "merge",
         "--local_dir", os.path.join(out, "checkpoints", f"global_step_{args.rl_steps}", "actor"),
         "--target_dir", rl_model], env)
    run([PYTHON, "-m", "verlx.tools.plot", rl, "--out", os.path.join(out, "training_curves.png")], env)
    _report(val_accuracy(metrics), args.test_size, (time.time() - start) / 60)
    print(f"metrics: {metrics}\ncurves:  {os.path.join(out, 'training_curves.png')}\nmodel:   {rl_model}")
    return 0


def _grpo_command(args, data: str, sft: str, rl: str, out: str, extra: list[str]) -> list[str]:
    return [
        PYTHON, "-m", "verlx.trainer.main_ppo",
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
        "data.train_batch_size=32", "data.max_prompt_length=32", "data.max_response_length=32",
        f"actor_rollout_ref.model.path={sft}",
        "actor_rollout_ref.model.enable_gradient_checkpointing=false",
        "actor_rollout_ref.actor.optim.lr=3e-4", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.n=8",
        "actor_rollout_ref.rollout.temperature=1.0", f"actor_rollout_ref.rollout.seed={args.seed}",
        f"trainer.n_gpus_per_node={args.workers}", "trainer.device=cpu", f"trainer.seed={args.seed}",
        f"trainer.total_training_steps={args.rl_steps}", "trainer.test_freq=5",
        f"trainer.save_freq={args.rl_steps}",
        "trainer.val_before_train=true", "trainer.logger=[console,file]",
        "trainer.project_name=verlx_quickstart", "trainer.experiment_name=arithmetic_grpo",
        f"trainer.output_dir={rl}", f"trainer.default_local_dir={out}/checkpoints",
        "trainer.resume_mode=disable", "reward.num_workers=1", *extra,
    ]


def _report(points: list[tuple[int, float, float]], test_size: int, minutes: float) -> None:
    """Accuracy along the run with standard errors, and whether the gain stands out of the test set's noise."""
    print(f"\nheld-out accuracy (greedy, {test_size} unseen sums; ± one standard error):")
    for step, acc, err in points:
        print(f"  step {step:3d}: {acc:6.1%} ± {100 * err:.1f}")
    if len(points) < 2:
        return
    (_, before, err_before), (_, after, err_after) = points[0], points[-1]
    err = math.sqrt(err_before**2 + err_after**2)
    print(f"before RL {before:.1%} -> after RL {after:.1%} ({100 * (after - before):+.1f} points, ± "
          f"{100 * err:.1f}) in {minutes:.1f} min")
    if abs(after - before) < 2 * err:
        print(f"the change is within two standard errors ({200 * err:.1f} points) of the {test_size}-row test set: "
              "it cannot be told from noise; use a larger --test_size")


def _claim_output_dir(out: str, settings: dict) -> None:
    """Stages resume from what the output directory holds: it must hold a run with the same settings."""
    stamp = os.path.join(out, "quickstart.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            previous = json.load(f)
        if previous != settings:
            raise SystemExit(f"{out} holds the quick start of {previous}, whose stages would be reused for "
                             f"{settings}; pass another --output_dir (or delete {out})")
        return
    os.makedirs(out, exist_ok=True)
    with open(stamp, "w") as f:
        json.dump(settings, f)


def _examples() -> str:
    """examples/data_preprocess next to the package (an editable install or a source checkout)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "examples", "data_preprocess")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} not found: run the quick start from a source checkout of verlx")
    return path


if __name__ == "__main__":
    sys.exit(main())
