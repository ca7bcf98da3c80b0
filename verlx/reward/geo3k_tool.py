"""veRL's demo tool `calc_geo3k_reward` (verl.tools.geo3k_tool.Geo3kTool), which its Geometry3K multi-turn examples
declare: the whole submitted answer (veRL scores it without looking for \\boxed{}) against the ground truth, 1.0 or
0.0 (veRL's geo3k score with no format weight). The comparison is verlx's MATH normalisation
(verlx/reward/scores/geo3k.py), not the mathruler grader veRL uses; verlx/reward/answer_tool.py says what the answer
tools share and where they differ from veRL's."""

from __future__ import annotations

from typing import Any

from verlx.reward.answer_tool import AnswerTool
from verlx.reward.scores.geo3k import answer_score


class Geo3kTool(AnswerTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_geo3k_reward",
            "description": "A tool for calculating the reward of geo3k",
            "parameters": {
                "type": "object",
                "properties": {"answer": {"type": "string",
                                          "description": "The answer to the question, enclosed in \\boxed{}"}},
                "required": ["answer"]},
        },
    }

    def score(self, answer: str, ground_truth: Any) -> float:
        return answer_score(answer, ground_truth)
