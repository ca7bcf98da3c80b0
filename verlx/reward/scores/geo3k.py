"""Geometry3K answers (data_source hiyouga/geometry3k): 0.9 × the boxed answer's correctness + 0.1 × the format.

The weights and the format rule (a <think>...</think> block, then a \\boxed{...} answer, nothing required around them)
are veRL's geo3k reward's. The answer is compared with verlx's MATH normalisation (verlx.reward.scores.math) after
dropping a trailing unit word ("12 cm", "45 degrees") and enclosing braces, as the mathruler grader veRL uses does;
the two can still disagree on rare spellings of one answer (mathruler also asks sympy whether two expressions are
equal).
"""

from __future__ import annotations

import re
from typing import Any

from verlx.reward.scores.math import is_equiv, last_boxed_content
from verlx.reward.scores.registry import register_score

FORMAT_WEIGHT = 0.1
_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)
# a unit word after the number ("12 cm", "45 degrees", "3 feet^2"), which veRL's grader drops from both sides
_UNIT = re.compile(r"\s*(degree|cm|centimeter|meter|mile|second|minute|hour|day|week|month|year|foot|feet|inch|yard)"
                   r"(es|s)?\s*(\^\s*\{?[0-9]+\}?)?\s*$")


def format_score(solution_str: str) -> float:
    return 1.0 if _FORMAT.fullmatch(solution_str) else 0.0


def _equiv(answer: str | None, ground_truth: Any) -> bool:
    """verlx's MATH equivalence after dropping a trailing unit word and enclosing braces, as veRL's grader does."""
    if answer is None:
        return False
    bare = [_UNIT.sub("", str(text).strip()) for text in (answer, ground_truth)]
    bare = [text[1:-1] if text.startswith("{") and text.endswith("}") else text for text in bare]
    return is_equiv(*bare)


def answer_score(answer: str, ground_truth: Any) -> float:
    """1.0 when a bare answer equals the ground truth, else 0.0. An answer that is one \\boxed{...} as a whole is
    read as its content (veRL's grader renders the LaTeX to text); a \\boxed{} inside other text is not looked for."""
    whole = answer.strip()
    if whole.startswith("\\boxed{") and last_boxed_content(whole) == whole[len("\\boxed{"):-1]:
        answer = whole[len("\\boxed{"):-1]
    return 1.0 if _equiv(answer, ground_truth) else 0.0


def accuracy_score(solution_str: str, ground_truth: Any) -> float:
    return 1.0 if _equiv(last_boxed_content(solution_str), ground_truth) else 0.0


@register_score("hiyouga/geometry3k")
def score_geo3k(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return ((1.0 - FORMAT_WEIGHT) * accuracy_score(solution_str, ground_truth)
            + FORMAT_WEIGHT * format_score(solution_str))
