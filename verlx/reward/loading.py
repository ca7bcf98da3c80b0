"""Load the user's reward function from a Python file (custom_reward_function.path / .name / .reward_kwargs).

The loaded function is wrapped in `FileRewardFunction`, which pickles as (path, name, kwargs): scoring worker
processes re-import the file themselves, so functions from any file work across process boundaries.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable
from typing import Any

from verlx.reward.scores import SCORE_FUNCTIONS, default_compute_score
from verlx.utils.paths import expand_path
from verlx.utils.registry import UnknownNameError
from verlx.utils.user_code import import_file

_CALL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")


class FileRewardFunction:
    """`name` from the file at `path`, called with `kwargs` bound; pickles by reference to the file."""

    def __init__(self, path: str, name: str = "compute_score", kwargs: dict[str, Any] | None = None):
        self.path = expand_path(path, absolute=True)
        self.name = name
        self.kwargs = dict(kwargs or {})
        if not os.path.isfile(self.path):
            raise FileNotFoundError(
                f"custom_reward_function.path={path} does not exist (resolved to {self.path}); "
                "point it at a Python file that defines the reward function, or set it to null for the built-in scores"
            )
        module = import_file(self.path, "custom_reward_function.path")
        fn = getattr(module, name, None)
        if not callable(fn):
            defined = sorted(
                k for k, v in vars(module).items() if callable(v) and getattr(v, "__module__", None) == module.__name__
            )
            raise AttributeError(
                f"custom_reward_function.name={name} is not a function in {self.path}; "
                f"callables defined there: {', '.join(defined) or '(none)'}"
            )
        self._check_signature(fn)
        self._fn: Callable = fn

    def _check_signature(self, fn: Callable) -> None:
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError):
            return
        try:
            signature.bind(**{a: None for a in _CALL_ARGUMENTS}, **self.kwargs)
        except TypeError as e:
            raise TypeError(
                f"{self.name} in {self.path} cannot be called as {self.name}({', '.join(_CALL_ARGUMENTS)}"
                f"{''.join(', ' + k + '=...' for k in self.kwargs)}) (keywords; the extra ones come from "
                f"custom_reward_function.reward_kwargs): {e}"
            ) from None

    def __call__(self, data_source, solution_str, ground_truth, extra_info=None):
        return self._fn(
            data_source=data_source,
            solution_str=solution_str,
            ground_truth=ground_truth,
            extra_info=extra_info,
            **self.kwargs,
        )

    def __reduce__(self):
        return FileRewardFunction, (self.path, self.name, self.kwargs)

    def __repr__(self) -> str:
        return f"FileRewardFunction({self.path!r}, {self.name!r}, {self.kwargs!r})"


def load_reward_function(config) -> Callable:
    """The reward function of a CustomRewardFunctionConfig; the built-in scores when its path is null."""
    if not config.path:
        if config.reward_kwargs:
            raise ValueError(
                "custom_reward_function.reward_kwargs is set but custom_reward_function.path is null; "
                "the built-in scores take no extra arguments"
            )
        return default_compute_score
    return FileRewardFunction(config.path, config.name, dict(config.reward_kwargs or {}))


def describe_reward_function(config, data_source: str) -> str:
    """Which function scores `data_source` under a CustomRewardFunctionConfig, as a user would look it up."""
    if config.path:
        return f"custom_reward_function {config.name} in {expand_path(config.path, absolute=True)}"
    try:
        fn = SCORE_FUNCTIONS.get(data_source)
    except UnknownNameError:
        return f"the built-in score for data_source {data_source!r} (none is registered)"
    return f"the built-in score for data_source {data_source!r} ({fn.__module__}.{fn.__qualname__})"
