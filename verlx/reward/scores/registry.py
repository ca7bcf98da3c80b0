"""Built-in rule scores, keyed by the data_source column of a dataset row.

Kept apart from the score modules so that each module registers itself with a decorator and the lookup
(`default_compute_score`) stays free of if/elif chains.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from verlx.utils.registry import Registry, UnknownNameError

#: (solution_str, ground_truth, extra_info) -> float | dict with a "score"
ScoreFunction = Callable[[str, Any, Any], "float | dict"]

SCORE_FUNCTIONS: Registry[ScoreFunction] = Registry("data_source", "data.reward_fn_key")


def register_score(*data_sources: str) -> Callable[[ScoreFunction], ScoreFunction]:
    """Register one score function under every given data_source."""

    def decorator(fn: ScoreFunction) -> ScoreFunction:
        for name in data_sources:
            SCORE_FUNCTIONS.register(name)(fn)
        return fn

    return decorator


def default_compute_score(
    data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
) -> float | dict:
    """Score one response with the built-in rule of its data_source."""
    try:
        fn = SCORE_FUNCTIONS.get(data_source)
    except UnknownNameError as e:
        raise UnknownNameError(
            f"{e} No built-in reward score for data_source {data_source!r}: write a Python file with "
            "compute_score(data_source, solution_str, ground_truth, extra_info) and set "
            "custom_reward_function.path to it (custom_reward_function.name picks another function name)."
        ) from None
    if ground_truth is None:
        raise ValueError(
            f"no ground truth to score data_source {data_source!r} against: the row's reward_model has no "
            "'ground_truth' (see examples/data_preprocess for the expected columns)"
        )
    return fn(solution_str, ground_truth, extra_info)
