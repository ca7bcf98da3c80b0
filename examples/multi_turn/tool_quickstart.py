"""`python examples/multi_turn/tool_quickstart.py`: the tiny model learns to use a calculator, on 2 CPU cores.

Two-digit multiplication is beyond the 0.8M-parameter quick-start model. Given the built-in calculator tool:
1. build the tiny model (verlx.models.tiny) and the multiplication set (examples/data_preprocess/
   multiplication_tool.py: agent_name=tool_agent on every row),
2. warm-start it with SFT on targets of which only --tool_fraction use the tool (so the policy calls it
   sometimes, and guesses otherwise),
3. train it with GRPO through main_ppo with actor_rollout_ref.rollout.multi_turn.enable=true (the native engine,
   2 CPU workers); the reward is 1 for the right final "#### <product>", so calling the tool pays,
4. plot the tool-call rate, the turns per sample and the accuracy (train and held-out) over the steps.

Each stage is the ordinary command (printed before it runs); stages whose output exists are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PYTHON = sys.executable
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def run(cmd: list[str], env: dict) -> None:
    print("\n$ " + " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, env=env)


def read_rows(path: str) -> list[dict]:
    rows = []
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def series(rows: list[dict], key: str) -> tuple[list[int], list[float]]:
    points = [(int(r["step"]), float(r[key])) for r in rows if isinstance(r.get(key), (int, float))]
    return [p[0] for p in points], [p[1] for p in points]


def plot(rows: list[dict], out: str, val_key: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    left.plot(*series(rows, "tool/call_rate"), label="samples that call the tool")
    left.plot(*series(rows, "critic/score/mean"), label="train accuracy (sampled, T=1)")
    left.plot(*series(rows, val_key), "o-", label="held-out accuracy (greedy)")
    left.set_ylim(-0.02, 1.02)
    left.set_title("Calculator use and accuracy")
    right.plot(*series(rows, "multi_turn/num_turns/mean"), label="model turns per sample (mean)")
    right.plot(*series(rows, "tool/calls/mean"), label="tool calls per sample (mean)")
    right.set_title("Turns")
    for ax in (left, right):
        ax.set_xlabel("GRPO step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output_dir", default="runs/tool_quickstart")
    p.add_argument("--rl_steps", type=int, default=60)
    p.add_argument("--sft_steps", type=int, default=1200)
    p.add_argument("--tool_fraction", type=float, default=0.3)
    p.add_argument("--workers", type=int, default=2, help="CPU worker processes (trainer.n_gpus_per_node)")
    args, extra = p.parse_known_args(argv)
    out = os.path.abspath(args.output_dir)
    model, data, sft, rl = (os.path.join(out, d) for d in ("model", "data", "sft_model", "grpo"))
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "0",
           "PYTHONPATH": os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))}
    start = time.time()
    if not os.path.exists(os.path.join(model, "config.json")):
        run([PYTHON, "-m", "verlx.models.tiny", "--output_dir", model], env)
    if not os.path.exists(os.path.join(data, "test.parquet")):
        run([PYTHON, os.path.join(REPO, "examples", "data_preprocess", "multiplication_tool.py"),
             "--local_save_dir", data, "--tool_fraction", str(args.tool_fraction)], env)
    if not os.path.exists(os.path.join(sft, "config.json")):
        run([PYTHON, "-m", "verlx.trainer.main_sft", f"data.train_files={data}/train.parquet", "data.val_files=null",
             "data.max_length=160", f"model.partial_pretrain={model}", f"trainer.default_local_dir={sft}",
             f"trainer.output_dir={out}/sft_logs", f"trainer.total_training_steps={args.sft_steps}",
             "data.train_batch_size=64", "data.micro_batch_size_per_gpu=64", "trainer.target_val_accuracy=null",
             "trainer.log_freq=50"], env)
    metrics = os.path.join(rl, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    run([PYTHON, "-m", "verlx.trainer.main_ppo",
         "algorithm.adv_estimator=grpo",
         f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
         "data.train_batch_size=16", "data.max_prompt_length=32", "data.max_response_length=128",
         "data.return_raw_chat=true",
         f"actor_rollout_ref.model.path={sft}", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
         "actor_rollout_ref.actor.optim.lr=2e-4", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
         "actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384",
         "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
         "actor_rollout_ref.rollout.name=native", "actor_rollout_ref.rollout.n=8",
         "actor_rollout_ref.rollout.temperature=1.0",
         "actor_rollout_ref.rollout.multi_turn.enable=true",
         f"actor_rollout_ref.rollout.multi_turn.tool_config_path={HERE}/calculator_tools.yaml",
         "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2",
         f"trainer.n_gpus_per_node={args.workers}", "trainer.device=cpu",
         f"trainer.total_training_steps={args.rl_steps}", "trainer.test_freq=10", "trainer.save_freq=-1",
         "trainer.val_before_train=true", "trainer.logger=[console,file]",
         "trainer.project_name=verlx_tool_quickstart", "trainer.experiment_name=multiplication_calculator",
         f"trainer.output_dir={rl}", f"trainer.default_local_dir={out}/checkpoints",
         "trainer.resume_mode=disable", "reward.num_workers=1", *extra], env)
    rows = read_rows(metrics)
    val_key = "val-core/arithmetic/reward/mean@1"
    png = os.path.join(out, "tool_curves.png")
    plot(rows, png, val_key)
    minutes = (time.time() - start) / 60
    steps, rate = series(rows, "tool/call_rate")
    val_steps, val = series(rows, val_key)
    print(f"\ntool-call rate: step {steps[0]} {rate[0]:.0%} -> step {steps[-1]} {rate[-1]:.0%}")
    print("held-out accuracy (greedy): " + ", ".join(f"step {s}: {v:.1%}" for s, v in zip(val_steps, val)))
    print(f"{minutes:.1f} min; metrics: {metrics}; curves: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
