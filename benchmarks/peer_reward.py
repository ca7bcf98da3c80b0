"""The reward both systems of benchmarks/peer_verl.py score with: the same file, so that reward time is alike.

1.0 when the number after the last "#### " of the response equals the ground truth (the arithmetic set's answer
format, examples/data_preprocess/arithmetic.py), else 0.0. veRL's built-in scores do not know the set's data_source
("arithmetic"), so both runs name this file as their custom reward function.
"""

from __future__ import annotations

import re

ANSWER = re.compile(r"####\s*(-?[\d,]+)")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    found = ANSWER.findall(solution_str or "")
    return float(bool(found) and found[-1].replace(",", "") == str(ground_truth).strip())
