"""`python -m verlx.quickstart`: the embedded default, end to end on a laptop-class CPU.

1. build a tiny Qwen2-architecture model and its tokenizer (save_pretrained),
2. write the synthetic arithmetic set (GSM8K schema): train, a validation split for SFT and a test split that no
   training decision ever sees,
3. warm-start the model with a short SFT run that stops once it is sometimes right (on the validation split),
4. train it with GRPO through main_ppo (2 CPU workers, the native rollout engine), validating on the held-out
   problems before training and along the way,
5. export the trained actor as a Hugging Face model directory (`grpo_model`), print validation accuracy before
   and after, and draw the training curves.

Each stage is the ordinary command a user would run (printed before it runs); stages whose output exists are
skipped, so an interrupted quick start resumes where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PYTHON = sys.executable


def run(cmd: list[str], env: dict | None = None) -> None:
    print("\n$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def val_accuracy(metrics_path: str) -> list[tuple[int, float]]:
    """(step, held-out accuracy) for every validation the run logged."""
    points = []
    with open(metrics_path) as f:
        for line in f:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            for key, value in row.items():
                if key.startswith("val-core/") and "/reward/mean@" in key:
                    points.append((int(row["step"]), float(value)))
    return points


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m verlx.quickstart", description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", default="runs/quickstart")
    p.add_argument("--rl_steps", type=int, default=50)
    p.add_argument("--workers", type=int, default=2, help="CPU worker processes (trainer.n_gpus_per_node)")
    args, extra = p.parse_known_args(argv)
    out = os.path.abspath(args.output_dir)
    model, data, sft, rl, rl_model = (os.path.join(out, d) for d in ("model", "data", "sft_model", "grpo",
                                                                     "grpo_model"))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0"}
    start = time.time()

    if not os.path.exists(os.path.join(model, "config.json")):
        run([PYTHON, "-m", "verlx.models.tiny", "--output_dir", model], env)
    if not os.path.exists(os.path.join(data, "test.parquet")):
        run([PYTHON, os.path.join(_examples(), "arithmetic.py"), "--local_save_dir", data, "--val_size", "250"], env)
    if not os.path.exists(os.path.join(sft, "config.json")):
        run([PYTHON, "-m", "verlx.trainer.main_sft", f"data.train_files={data}/train.parquet",
             f"data.val_files={data}/val.parquet", f"model.partial_pretrain={model}",
             f"trainer.default_local_dir={sft}", f"trainer.output_dir={out}/sft_logs"], env)
    metrics = os.path.join(rl, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)  # a re-run trains afresh (resume_mode=disable) and starts its curve afresh
    run([PYTHON, "-m", "verlx.trainer.main_ppo",
         "algorithm.adv_estimator=grpo",
         f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
         "data.train_batch_size=32", "data.max_prompt_length=32", "data.max_response_length=16",
         f"actor_rollout_ref.model.path={sft}",
         "actor_rollout_ref.model.enable_gradient_checkpointing=false",
         "actor_rollout_ref.actor.optim.lr=1e-4", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
         "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
         "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
         "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.n=8",
         "actor_rollout_ref.rollout.temperature=1.0",
         f"trainer.n_gpus_per_node={args.workers}", "trainer.device=cpu",
         f"trainer.total_training_steps={args.rl_steps}", "trainer.test_freq=10",
         f"trainer.save_freq={args.rl_steps}",
         "trainer.val_before_train=true", "trainer.logger=[console,file]",
         "trainer.project_name=verlx_quickstart", "trainer.experiment_name=arithmetic_grpo",
         f"trainer.output_dir={rl}", f"trainer.default_local_dir={out}/checkpoints",
         "trainer.resume_mode=disable", "reward.num_workers=1", *extra], env)
    run([PYTHON, "-m", "verlx.model_merger", "merge",
         "--local_dir", os.path.join(out, "checkpoints", f"global_step_{args.rl_steps}", "actor"),
         "--target_dir", rl_model], env)
    run([PYTHON, "-m", "verlx.tools.plot", rl, "--out", os.path.join(out, "training_curves.png")], env)

    points = val_accuracy(metrics)
    minutes = (time.time() - start) / 60
    print("\nheld-out arithmetic accuracy (greedy, validation set):")
    for step, acc in points:
        print(f"  step {step:3d}: {acc:6.1%}")
    if len(points) >= 2:
        print(f"before RL {points[0][1]:.1%} -> after RL {points[-1][1]:.1%} in {minutes:.1f} min")
    print(f"metrics: {metrics}\ncurves:  {os.path.join(out, 'training_curves.png')}\nmodel:   {rl_model}")
    return 0


def _examples() -> str:
    """examples/data_preprocess next to the package (an editable install or a source checkout)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    path = os.path.join(here, "examples", "data_preprocess")
    if not os.path.isdir(path):
        raise FileNotFoundError(f"{path} not found: run the quick start from a source checkout of verlx")
    return path


if __name__ == "__main__":
    sys.exit(main())
