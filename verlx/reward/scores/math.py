"""MATH-style answers: the last \\boxed{...} (or \\fbox{...}) of a response against the reference answer.

Both sides are normalised the usual way for MATH (spaces, \\left/\\right, degrees, dollars, units, percent,
\\dfrac/\\tfrac, bare \\frac12 and \\sqrt3, "x = 5", a/b) and then compared as strings, or as exact fractions
when both read as numbers, so "0.5", "1/2" and "\\frac{1}{2}" are the same answer.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from verlx.reward.scores.registry import register_score

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def _closing_brace(text: str, open_index: int) -> int | None:
    """Index of the brace that closes the one at open_index, or None when unbalanced."""
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
    return None


def last_boxed_content(text: str) -> str | None:
    """Content of the last \\boxed{...} / \\fbox{...} (nested braces kept), or of "\\boxed 5"; None if absent."""
    start, command = max((text.rfind(c), c) for c in _BOX_COMMANDS)
    if start < 0:
        return None
    i = start + len(command)
    if text.startswith("{", i):
        end = _closing_brace(text, i)
        return None if end is None else text[i + 1 : end]
    if text.startswith(" ", i):
        return re.split(r"[$\n]", text[i:], maxsplit=1)[0].strip() or None
    return None


def _read_argument(text: str, i: int) -> tuple[str, int] | None:
    """One LaTeX argument at i: a {group}, a \\command or a single character; with the index after it."""
    if i >= len(text):
        return None
    if text[i] == "{":
        end = _closing_brace(text, i)
        return None if end is None else (text[i + 1 : end], end + 1)
    if text[i] == "\\":
        m = re.match(r"\\[a-zA-Z]+", text[i:])
        if m:
            return m.group(0), i + m.end()
    return text[i], i + 1


def _brace_arguments(text: str, command: str, n_args: int) -> str:
    """Rewrite `command` so its arguments are braced: \\frac12 -> \\frac{1}{2}, \\sqrt3 -> \\sqrt{3}."""
    out, i = [], 0
    while True:
        j = text.find(command, i)
        if j < 0:
            out.append(text[i:])
            return "".join(out)
        out.append(text[i:j])
        k, args = j + len(command), []
        if text.startswith("[", k):  # \sqrt[3]{x}: leave optional arguments alone
            out.append(command)
            i = k
            continue
        for _ in range(n_args):
            read = _read_argument(text, k)
            if read is None:
                break
            args.append(_brace_arguments(read[0], command, n_args))
            k = read[1]
        if len(args) < n_args:
            out.append(text[j:])
            return "".join(out)
        out.append(command + "".join("{" + a + "}" for a in args))
        i = k


_UNIT_TEXT = re.compile(r"\\text\{ ")
_TEXT_WRAPPER = re.compile(r"\\(?:text|textbf|mbox)\{([^{}]*)\}")
_SHORT_LHS = re.compile(r"^[a-zA-Z]\w?=")
_INT_SLASH_INT = re.compile(r"^(-?\d+)/(-?\d+)$")


def normalize_answer(answer: str) -> str:
    """The canonical string form of a MATH answer."""
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "").replace("$", "")
    unit = list(_UNIT_TEXT.finditer(s))
    if unit:  # "5 \text{ cm}": a \text with a leading space is a unit on the right
        s = s[: unit[-1].start()]
    s = _TEXT_WRAPPER.sub(r"\1", s)
    s = s.replace("\\%", "").replace("%", "")
    for thin_space in ("\\,", "\\;", "\\:", "\\ "):
        s = s.replace(thin_space, "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    s = s.replace(" ", "")
    if s.count("=") == 1 and _SHORT_LHS.match(s):
        s = s.split("=", 1)[1]
    s = _brace_arguments(s, "\\sqrt", 1)
    s = _brace_arguments(s, "\\frac", 2)
    slash = _INT_SLASH_INT.match(s)
    if slash:
        s = "\\frac{" + slash.group(1) + "}{" + slash.group(2) + "}"
    return s.rstrip(".")


_DECIMAL = re.compile(r"^-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?$|^-?\.\d+$")
_FRAC = re.compile(r"^(-?)\\frac\{(-?\d+)\}\{(-?\d+)\}$")


def as_fraction(normalized: str) -> Fraction | None:
    """The exact value of an integer, decimal or \\frac{int}{int}; None for anything else."""
    if _DECIMAL.match(normalized):
        return Fraction(normalized.replace(",", ""))
    m = _FRAC.match(normalized)
    if m and int(m.group(3)) != 0:
        value = Fraction(int(m.group(2)), int(m.group(3)))
        return -value if m.group(1) else value
    return None


def is_equiv(answer: str | None, reference: str | None) -> bool:
    if answer is None or reference is None:
        return False
    a, b = normalize_answer(answer), normalize_answer(reference)
    if a == b:
        return True
    fa, fb = as_fraction(a), as_fraction(b)
    return fa is not None and fa == fb


def compute_score(solution_str: str, ground_truth: Any) -> float:
    """1.0 when the last boxed answer equals the reference, else 0.0."""
    reference = str(ground_truth)
    boxed_reference = last_boxed_content(reference)
    return 1.0 if is_equiv(last_boxed_content(solution_str), boxed_reference or reference) else 0.0


@register_score("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
def score_math(solution_str: str, ground_truth: Any, extra_info: Any = None) -> float:
    return compute_score(solution_str, ground_truth)
