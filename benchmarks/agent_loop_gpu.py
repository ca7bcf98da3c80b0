"""Multi-turn GRPO through main_ppo: a Qwen2.5-0.5B-shaped model (random weights), GSM8K-tool-style prompts,
`actor_rollout_ref.rollout.multi_turn.enable=true`; prints turns, tool calls and phase timings per step.

Random weights never write a tool call, so the samples run `BenchmarkToolLoop` (below, a user agent loop named
as module:Class): each model turn of up to --turn-tokens tokens is followed by a real calculator call through the
tool executor, --tool-turns times, then a last model turn. That exercises what a trained tool user costs the
engine: requests arriving while others decode, contexts growing by template deltas, masks over tool tokens.

  python benchmarks/agent_loop_gpu.py --engine native --steps 3            # GPU, 0.5B shape
  python benchmarks/agent_loop_gpu.py --engine sglang --steps 3
  python benchmarks/agent_loop_gpu.py --device cpu --shape tiny --steps 1  # CPU smoke (the unit test runs it)

Micro-batches are the workers' choice by default (token budgets, as in grpo_step_gpu.py), so the multi-turn update
compares with the single-turn one; `--micro-batches fixed` passes the fixed sizes this script used before
(16 samples per update micro-batch, 32 per log-prob one: at the default shape 32 update micro-batches of ~7k
tokens per step instead of a few of up to the token budget; the 2026-11 multi-turn GPU updates ran so, against
single-turn updates with token budgets). The workers' choices are printed after the table.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, ROOT)

from verlx.rollout.agent.loops import AgentLoop, record_outcomes  # noqa: E402
from verlx.rollout.agent.parsers import ParsedTurn, ToolCall  # noqa: E402

SHOWN = ("multi_turn/num_turns/mean", "tool/calls/mean", "tool/latency_s", "tool/errors",
         "multi_turn/template_mismatch", "response_length/mean", "timing_s/step", "timing_s/gen",
         "timing_s/generate_engine", "timing_s/update_weights", "timing_s/reward", "timing_s/old_log_prob",
         "timing_s/ref", "timing_s/update_actor", "perf/throughput", "perf/max_memory_allocated_gb")
SYSTEM = "Solve the problem. Use the calculator tool for arithmetic. Put the final answer after \"####\"."


class BenchmarkToolLoop(AgentLoop):
    """Model turns of at most TURN_TOKENS tokens, each but the last followed by a calculator call (the call is
    made for the model: random weights would never write one)."""

    uses_tools = True
    TOOL_TURNS = int(os.environ.get("VERLX_BENCH_TOOL_TURNS", "2"))
    TURN_TOKENS = int(os.environ.get("VERLX_BENCH_TURN_TOKENS", "64"))

    async def run(self, sample) -> None:
        question = sample.messages[-1]["content"]
        a, b = _operands(question)
        for turn in range(self.TOOL_TURNS + 1):
            if await sample.generate(self.TURN_TOKENS) is None:
                return
            if turn == self.TOOL_TURNS:
                return sample.stop("answered")
            call = ParsedTurn(calls=[ToolCall("calculator", {"expression": f"{a}*{b}+{turn}"})])
            outcomes = await self.env.executor.run(call, sample.tools_kwargs)
            record_outcomes(sample.trajectory, outcomes)
            if not sample.append_messages([{"role": "tool", "content": o.text} for o in outcomes]):
                return


def _operands(question: str) -> tuple[int, int]:
    numbers = [int(w.strip(".,?")) for w in question.split() if w.strip(".,?").isdigit()]
    return numbers[0], numbers[1]


def write_data(data_dir: str, rows: int) -> None:
    from verlx.data.parquet import write_parquet_atomic

    rng = random.Random(0)
    for split, count in (("train", rows), ("test", 16)):
        out = []
        for i in range(count):
            a, b = rng.randint(10, 999), rng.randint(10, 99)
            question = f"A shop packs {a} boxes with {b} apples each. How many apples does it pack?"
            out.append({"data_source": "openai/gsm8k", "agent_name": "agent_loop_gpu:BenchmarkToolLoop",
                        "prompt": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
                        "reward_model": {"style": "rule", "ground_truth": str(a * b)},
                        "extra_info": {"split": split, "index": i}})
        write_parquet_atomic(out, os.path.join(data_dir, f"{split}.parquet"))


def agent_overrides(args, model_dir: str, data_dir: str, out_dir: str, work: str) -> list[str]:
    """main_ppo's overrides; micro-batch sizes only with --micro-batches fixed (else the workers decide)."""
    response_length = (args.tool_turns + 1) * (args.turn_tokens + 48)  # model turns + tool deltas
    per_gpu = args.prompts * args.n // args.gpus
    overrides = [
        "algorithm.adv_estimator=grpo", f"data.train_files={data_dir}/train.parquet",
        f"data.val_files={data_dir}/test.parquet", f"data.train_batch_size={args.prompts}",
        "data.max_prompt_length=256", f"data.max_response_length={response_length}", "data.return_raw_chat=true",
        f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.actor.optim.lr=1e-6",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={max(1, args.prompts // 2)}",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        f"actor_rollout_ref.rollout.name={args.engine}", f"actor_rollout_ref.rollout.n={args.n}",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.rollout.multi_turn.enable=true",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={ROOT}/examples/multi_turn/calculator_tools.yaml",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={args.tool_turns + 1}",
        f"trainer.n_gpus_per_node={args.gpus}", f"trainer.total_training_steps={args.steps}",
        f"trainer.device={args.device}", "trainer.val_before_train=false", "trainer.test_freq=-1",
        "trainer.save_freq=-1", "trainer.logger=[console,file]", f"trainer.output_dir={out_dir}",
        f"trainer.default_local_dir={work}/ckpt", "trainer.progress_bar=false", "reward.num_workers=1",
    ]
    if args.micro_batches == "fixed":  # this script's sizes before the workers sized micro-batches
        overrides += [f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={max(1, min(16, per_gpu // 2))}",
                      f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={max(1, min(32, per_gpu))}",
                      f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={max(1, min(32, per_gpu))}"]
    return [*overrides, *args.extra]


def main() -> int:
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    from grpo_step_gpu import SHAPES, auto_decisions, build_model, run_logged

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="0.5b", choices=list(SHAPES))
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--engine", default="native", help="native, sglang or vllm")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--prompts", type=int, default=64, help="data.train_batch_size")
    p.add_argument("--n", type=int, default=8, help="actor_rollout_ref.rollout.n")
    p.add_argument("--tool-turns", type=int, default=2, help="calculator calls per sample")
    p.add_argument("--turn-tokens", type=int, default=64, help="most tokens of one model turn")
    p.add_argument("--gpus", type=int, default=1)
    p.add_argument("--micro-batches", choices=("auto", "fixed"), default="auto")
    p.add_argument("--extra", nargs="*", default=[], help="more key=value overrides")
    args = p.parse_args()

    work = tempfile.mkdtemp(prefix="verlx-agent-")
    model_dir, data_dir, out_dir = (os.path.join(work, d) for d in ("model", "data", "out"))
    build_model(model_dir, args.shape)
    write_data(data_dir, max(4 * args.prompts, 64))
    overrides = agent_overrides(args, model_dir, data_dir, out_dir, work)
    env = {**os.environ, "VERLX_BENCH_TOOL_TURNS": str(args.tool_turns),
           "VERLX_BENCH_TURN_TOKENS": str(args.turn_tokens),
           "PYTHONPATH": os.pathsep.join(filter(None, [HERE, ROOT, os.environ.get("PYTHONPATH")]))}
    log_path = os.path.join(work, "main_ppo.log")
    rc = run_logged([sys.executable, "-m", "verlx.trainer.main_ppo", *overrides], env, log_path)
    with open(log_path) as f:
        decisions = auto_decisions(f.read())
    metrics_path = os.path.join(out_dir, "metrics.jsonl")
    rows = []
    if os.path.exists(metrics_path):
        with open(metrics_path) as f:
            rows = [json.loads(line) for line in f]
    print(f"\nengine={args.engine} shape={args.shape} device={args.device} prompts={args.prompts} n={args.n} "
          f"tool_turns={args.tool_turns} turn_tokens={args.turn_tokens}")
    print("| step | " + " | ".join(SHOWN) + " |")
    print("|---" * (len(SHOWN) + 1) + "|")
    for row in rows:
        cells = [f"{row[k]:.3g}" if isinstance(row.get(k), (int, float)) else "-" for k in SHOWN]
        print(f"| {row['step']} | " + " | ".join(cells) + " |")
    for line in decisions["lines"]:
        print(f"auto: {line}")
    if os.environ.get("OUT") and rows:
        shutil.copy(metrics_path, os.path.join(os.environ["OUT"], "agent_loop_metrics.jsonl"))
    shutil.rmtree(work, ignore_errors=True)
    return rc


if __name__ == "__main__":
    sys.exit(main())
