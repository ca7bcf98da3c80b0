"""Two-digit multiplication "a*b=?" with a calculator tool, for the multi-turn CPU demo (veRL schema).

    python examples/data_preprocess/multiplication_tool.py --local_save_dir ~/data/multiplication_tool

Every row runs the `tool_agent` loop (column agent_name); the calculator needs no per-sample arguments (no
extra_info.tools_kwargs). Answers are scored like GSM8K (data_source "arithmetic": the number after "#### ").
For the SFT warm start, extra_info.answer holds a target: for a --tool_fraction of the training rows the whole
tool-using trajectory (a hermes <tool_call> to the calculator, the tool's reply as the chat template renders it,
the final answer), for the others a bare answer — so the warm-started policy calls the tool only sometimes and RL
has something to learn. The test split never enters training.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

try:
    from verlx.data.parquet import write_parquet_atomic
except ImportError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from verlx.data.parquet import write_parquet_atomic

DATA_SOURCE = "arithmetic"


def tool_call(a: int, b: int) -> str:
    call = {"name": "calculator", "arguments": {"expression": f"{a}*{b}"}}
    return "<tool_call>" + json.dumps(call, separators=(",", ":")) + "</tool_call>"


def tool_trajectory(a: int, b: int) -> str:
    """The assistant's call, the tool turn and the answer as the tiny model's ChatML template renders them
    (the SFT trainer appends the final <|im_end|>)."""
    return (f"{tool_call(a, b)}<|im_end|>\n<|im_start|>tool\n{a * b}<|im_end|>\n<|im_start|>assistant\n"
            f"#### {a * b}")


def to_row(a: int, b: int, split: str, index: int, with_tool: bool) -> dict:
    question = f"{a}*{b}=?"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "agent_name": "tool_agent",
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a * b)},
        "extra_info": {"split": split, "index": index, "question": question,
                       "answer": tool_trajectory(a, b) if with_tool else f"#### {a * b}"},
    }


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_save_dir", default="~/data/multiplication_tool")
    parser.add_argument("--test_size", type=int, default=200)
    parser.add_argument("--tool_fraction", type=float, default=0.3,
                        help="fraction of SFT targets that use the tool (the rest answer directly)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    rng = random.Random(args.seed)
    rng.shuffle(pairs)
    splits = {"test": pairs[: args.test_size], "train": pairs[args.test_size:]}
    written = {}
    for split, chosen in splits.items():
        rows = [to_row(a, b, split, i, with_tool=rng.random() < args.tool_fraction) for i, (a, b) in enumerate(chosen)]
        written[split] = write_parquet_atomic(
            rows, os.path.join(os.path.expanduser(args.local_save_dir), f"{split}.parquet"))
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    main()
