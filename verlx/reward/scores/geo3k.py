"""Geometry3K answers (data_source hiyouga/geometry3k): 0.9 × the boxed answer's correctness + 0.1 × the format.

The weights and the format rule (a <think>...</think> block, then a \\boxed{...} answer, nothing required around them)
are veRL's geo3k reward's. The answer is compared with verlx's MATH normalisation (verlx.reward.scores.math), not
the mathruler grader veRL uses: the two can disagree on rare spellings of one answer.
"""

from __future__ import annotations

import re
from typing import Any

from verlx.reward.scores.math import is_equiv, last_boxed_content
from verlx.reward.scores.registry import register_score

FORMAT_WEIGHT = 0.1
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def format_score(solution_str: str) -> float:
    return 1.0 if _FORMAT.fullmatch(solution_str) else 0.0


def answer_score(answer: str, ground_truth: Any) -> float:
    """1.0 when the bare answer (no \\boxed{} looked for) equals the ground truth, else 0.0."""
    return 1.0 if is_equiv(answer, str(ground_truth)) else 0.0


def accuracy_score(solution_str: str, ground_truth: Any) -> float:
    return 1.0 if is_equiv(last_boxed_content(solution_str), str(ground_truth)) else 0.0


@register_score("hiyouga/geometry3k")
def score_geo3k(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return ((1.0 - FORMAT_WEIGHT) * accuracy_score(solution_str, ground_truth)
            + FORMAT_WEIGHT * format_score(solution_str))
