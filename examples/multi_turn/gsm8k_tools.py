"""The GSM8K example's own tool: `check_answer` tells the model whether an answer is right. Its ground truth
comes from the row's extra_info.tools_kwargs (a keyword-only parameter: not in the schema the model sees)."""

from __future__ import annotations

from verlx.reward.scores.gsm8k import answers_equal


def check_answer(answer: str, *, ground_truth: str) -> str:
    """Check a final answer to the problem; says whether it is correct.

    Args:
        answer: the number you believe is the answer
    """
    return "correct" if answers_equal(answer, ground_truth) else "incorrect"
