"""GSM8K-style answers: the number after "#### " (strict) or the last number in the text (flexible).

Numbers are compared as decimals, so "18", "18.0", "18.00", "$18" and "1,8" style commas all normalise alike.
Only the tail of a response is searched (responses can be long and the answer comes last), widened backwards
so that a number or marker cut by the window edge is still read whole.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation
from typing import Any

from verlx.reward.scores.registry import register_score

TAIL_CHARS = 300
_NUMBER = r"(?:\d[\d,]*(?:\.\d*)?|\.\d+)"
_PATTERNS = {
    "strict": re.compile(r"#### (\$?-?\$?" + _NUMBER + ")"),
    # A minus is a sign only when it is not a binary minus: "10-5" ends in 5, not -5.
    "flexible": re.compile(r"((?:(?<![\w.)\]])-)?" + _NUMBER + ")"),
}
# Characters that can belong to a match; the window is widened over them so no match is cut in half.
_MATCH_CHARS = frozenset("0123456789.,-$# ")


def _tail_start(text: str) -> int:
    start = max(len(text) - TAIL_CHARS, 0)
    while start > 0 and text[start - 1] in _MATCH_CHARS:
        start -= 1
    return start


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer as written (commas and '$' removed, trailing '.' dropped), or None when there is none."""
    try:
        pattern = _PATTERNS[method]
    except KeyError:
        raise ValueError(f"gsm8k method must be one of {sorted(_PATTERNS)}, got {method!r}") from None
    found = pattern.findall(solution_str, _tail_start(solution_str))
    if not found:
        return None
    return found[-1].replace(",", "").replace("$", "").rstrip(".")


def _as_decimal(text: str) -> Decimal | None:
    cleaned = text.strip().replace(",", "").replace("$", "").rstrip(".")
    try:
        value = Decimal(cleaned)
    except InvalidOperation:
        return None
    return value if value.is_finite() else None


def answers_equal(answer: str, ground_truth: Any) -> bool:
    """Numeric equality when both sides are numbers, otherwise equality of the cleaned strings."""
    truth = str(ground_truth)
    a, b = _as_decimal(answer), _as_decimal(truth)
    if a is not None and b is not None:
        return a == b
    return answer.strip() == truth.strip().replace(",", "").replace("$", "")


def compute_score(
    solution_str: str, ground_truth: Any, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """`score` for the right number, `format_score` for a wrong one, 0.0 when no number could be read."""
    answer = extract_solution(solution_str, method)
    if answer is None:
        return 0.0
    return score if answers_equal(answer, ground_truth) else format_score


@register_score("openai/gsm8k", "arithmetic")
def score_gsm8k_strict(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return compute_score(solution_str, ground_truth, method="strict")
