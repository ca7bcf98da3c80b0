"""Name → object registries with helpful errors.

Every pluggable piece (advantage estimators, policy losses, rollout engines, reward scores, dispatch modes)
is looked up by the name a user writes in the config, so an unknown name must say what would have worked.
"""

from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterator, TypeVar

T = TypeVar("T")


class UnknownNameError(KeyError):
    """KeyError whose message prints as written (KeyError alone would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0])


def did_you_mean(name: str, candidates) -> str:
    """A ' Did you mean X?' suffix for the closest candidate, or '' when none is close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


class Registry(Generic[T]):
    """A named mapping filled by the `register` decorator."""

    def __init__(self, kind: str, config_key: str | None = None):
        self.kind = kind
        self.config_key = config_key
        self._entries: dict[str, T] = {}

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self._entries and not override:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._entries[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            where = f" (config key {self.config_key})" if self.config_key else ""
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'{where}; registered: {', '.join(sorted(self._entries))}."
                + did_you_mean(name, self._entries)
            ) from None

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))
