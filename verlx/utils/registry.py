"""Name → object registries with helpful errors.

Every pluggable piece (advantage estimators, policy losses, rollout engines, reward scores, dispatch modes)
is looked up by the name a user writes in the config, so an unknown name must say what would have worked.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

from verlx.utils.errors import InputError

T = TypeVar("T")
# veRL's packages: verl itself and its recipe submodule (built on verl's classes)
VERL_PACKAGES = ("verl", "recipe")


class UnknownNameError(InputError, KeyError):
    """KeyError whose message prints as written (KeyError alone would quote it)."""

    def __str__(self) -> str:
        return str(self.args[0])


def did_you_mean(name: str, candidates) -> str:
    """A ' Did you mean X?' suffix for the closest candidate, or '' when none is close."""
    close = difflib.get_close_matches(str(name), [str(c) for c in candidates], n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def import_object(path: str, config_key: str | None = None):
    """The object named by 'package.module:attribute' (or veRL's spelling 'package.module.attribute'); an error
    naming the path (and key) when it cannot load."""
    module_name, sep, attribute = path.partition(":")
    if not sep and "." in path:
        module_name, sep, attribute = path.rpartition(".")
    where = f"{config_key}={path}" if config_key else path
    if not sep or not module_name or not attribute:
        raise ValueError(f"{where}: expected 'package.module:Attribute'")
    import importlib

    try:
        return getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as e:
        missing = getattr(e, "name", None) or ""
        if module_name.split(".")[0] in VERL_PACKAGES or missing.split(".")[0] == "verl":
            raise ValueError(f"{where}: verlx does not support veRL's own classes ({module_name}) yet: give a class "
                             f"of your own code or one of verlx's (docs/verl_compat.md); importing it: {e}") from None
        raise ValueError(f"{where}: cannot import {attribute} from {module_name}: {e}") from None


class Registry(Generic[T]):
    """A named mapping filled by the `register` decorator or, without importing anything, by `register_lazy`
    ('module:Attribute', imported on first use). With `import_paths`, a name of the form 'module:Attribute' that
    is not registered is imported as a user's own entry."""

    def __init__(self, kind: str, config_key: str | None = None, import_paths: bool = False):
        self.kind = kind
        self.config_key = config_key
        self.import_paths = import_paths
        self._entries: dict[str, T] = {}
        self._lazy: dict[str, str] = {}
        self._imported: dict[str, T] = {}  # user 'module:Attribute' names: cached, not listed among the registered

    def register(self, name: str, *, override: bool = False) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            if name in self and not override:
                raise ValueError(f"{self.kind} '{name}' is already registered")
            self._lazy.pop(name, None)
            self._entries[name] = obj
            return obj

        return decorator

    def register_lazy(self, name: str, target: str) -> None:
        """Register 'module:Attribute' under `name`; the module is imported by the first `get(name)`."""
        if name in self:
            raise ValueError(f"{self.kind} '{name}' is already registered")
        self._lazy[name] = target

    def get(self, name: str) -> T:
        if name not in self._entries and name in self._lazy:
            self._entries[name] = import_object(self._lazy.pop(name), self.config_key)
        if name not in self._entries and self.import_paths and ":" in str(name):
            if name not in self._imported:
                self._imported[name] = import_object(name, self.config_key)
            return self._imported[name]
        try:
            return self._entries[name]
        except KeyError:
            where = f" (config key {self.config_key})" if self.config_key else ""
            user = "; or 'package.module:Class' for your own" if self.import_paths else ""
            raise UnknownNameError(
                f"unknown {self.kind} '{name}'{where}; registered: {', '.join(self.names())}{user}."
                + did_you_mean(name, self.names())
            ) from None

    def names(self) -> list[str]:
        return sorted({*self._entries, *self._lazy})

    def __contains__(self, name: object) -> bool:
        return name in self._entries or name in self._lazy

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())
