"""GSM8K for multi-turn tool use → train.parquet / test.parquet (veRL schema plus agent columns).

    python examples/data_preprocess/gsm8k_tool.py --local_dataset_path /path/to/gsm8k \
        --local_save_dir ~/data/gsm8k_tool

Like gsm8k.py (same sources and answers), with: a system message offering the tools, `agent_name=tool_agent`
on every row (actor_rollout_ref.rollout.multi_turn.enable=true runs it), and `extra_info.tools_kwargs` giving the
`check_answer` tool of examples/multi_turn/gsm8k_tools.yaml the row's ground truth (the model never sees it; it
only learns whether its answer is right, as veRL's gsm8k tool does).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gsm8k  # noqa: E402  (the plain GSM8K preprocessing next to this file)

SYSTEM = ("You are a math expert. Use the calculator or python tools for arithmetic, and check_answer to test "
          "an answer before you give it. Put the final answer after \"####\".")


def to_row(example: dict, split: str, index: int, where: str) -> dict:
    row = gsm8k.to_row(example, split, index, where)
    row["prompt"] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": example["question"]}]
    row["agent_name"] = "tool_agent"
    row["extra_info"]["tools_kwargs"] = {"check_answer": {"ground_truth": row["reward_model"]["ground_truth"]}}
    return row


def main(argv: list[str] | None = None) -> dict[str, str]:
    return gsm8k.main(argv, make_row=to_row, save_dir="~/data/gsm8k_tool", description=__doc__)


if __name__ == "__main__":
    main()
