"""veRL's demo tool `calc_gsm8k_reward` (verl.tools.gsm8k_tool.Gsm8kTool), which its GSM8K multi-turn examples
declare, scored as veRL scores it: GSM8K's flexible rule, the last number of "#### <answer>" (verlx/reward/
answer_tool.py says what the answer tools share and where they differ from veRL's)."""

from __future__ import annotations

from typing import Any

from verlx.reward.answer_tool import AnswerTool
from verlx.reward.scores.gsm8k import compute_score


class Gsm8kTool(AnswerTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "A tool for calculating the reward of gsm8k",
            "parameters": {"type": "object",
                           "properties": {"answer": {"type": "string", "description": "The answer to the question"}},
                           "required": ["answer"]},
        },
    }

    def score(self, answer: str, ground_truth: Any) -> float:
        submitted = answer if answer.startswith("#### ") else "#### " + answer
        return compute_score(submitted, ground_truth, method="flexible", format_score=0.0, score=1.0)
