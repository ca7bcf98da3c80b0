"""GSM8K with a simulated user → train.parquet / test.parquet (veRL schema plus the interaction's columns).

    python examples/data_preprocess/gsm8k_interaction.py --local_dataset_path /path/to/gsm8k \
        --local_save_dir ~/data/gsm8k_interaction

Like gsm8k.py (same sources and answers), with: a system message asking for "#### <answer>" and for a second look
when told the answer is wrong, `agent_name=tool_agent` on every row (the loop that asks interactions), and
`extra_info.interaction_kwargs` naming the `gsm8k` interaction of examples/multi_turn/gsm8k_interaction.yaml with the
row's question and ground truth (the keys veRL's gsm8k_multiturn_w_interaction preprocessing writes).
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gsm8k  # noqa: E402  (the plain GSM8K preprocessing next to this file)

SYSTEM = ("Solve the math problem step by step and end with the final answer as \"#### <answer>\". If you are told "
          "the answer is wrong, check your work and answer again.")


def to_row(example: dict, split: str, index: int, where: str) -> dict:
    row = gsm8k.to_row(example, split, index, where)
    row["prompt"] = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": example["question"]}]
    row["agent_name"] = "tool_agent"
    row["extra_info"]["interaction_kwargs"] = {"name": "gsm8k", "query": example["question"],
                                               "ground_truth": row["reward_model"]["ground_truth"]}
    return row


def main(argv: list[str] | None = None) -> dict[str, str]:
    return gsm8k.main(argv, make_row=to_row, save_dir="~/data/gsm8k_interaction", description=__doc__)


if __name__ == "__main__":
    main()
