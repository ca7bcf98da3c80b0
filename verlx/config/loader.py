"""YAML / OmegaConf / dict → typed dataclasses, with unknown keys and wrong types reported by dotted path."""

from __future__ import annotations

import dataclasses
import logging
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar, Union

from verlx.utils.errors import InputError
from verlx.utils.registry import did_you_mean

T = TypeVar("T")
logger = logging.getLogger(__name__)
CONFIG_DIR = os.path.dirname(os.path.abspath(__file__))


class DataError(InputError, ValueError):
    """A problem with an input file or its rows: the message names the file (and row where known) and what to do.
    Entry points report it like a ConfigError: the message alone, exit status 2."""


class ConfigError(InputError, ValueError):
    """Every problem found in a config, each naming its key."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        lines = "\n".join(f"  - {p}" for p in self.problems)
        super().__init__(f"invalid config ({len(self.problems)} problem{'s' * (len(self.problems) != 1)}):\n{lines}")


@dataclasses.dataclass
class Findings:
    """The problems (and warnings) of a config, collected so that one ConfigError reports all of them at once."""

    problems: list[str] = dataclasses.field(default_factory=list)
    warnings: list[str] = dataclasses.field(default_factory=list)

    def require(self, ok: bool, message: str) -> bool:
        if not ok:
            self.problems.append(message)
        return ok

    def choice(self, key: str, value, allowed) -> bool:
        """`value` must be one of `allowed`; the problem names the key, the choices and the closest one."""
        allowed = list(allowed)
        return self.require(value in allowed, f"{key}={value!r} is not one of {allowed}.{did_you_mean(value, allowed)}")

    def raise_problems(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)


def build(cls: type[T], data: Mapping[str, Any] | None, path: str = "") -> T:
    """Build `cls` from a plain mapping; raise ConfigError listing every unknown key and type mismatch."""
    problems: list[str] = []
    obj = _build_dataclass(cls, data or {}, path, problems)
    if problems:
        raise ConfigError(problems)
    return obj


def _build_dataclass(cls, data: Mapping[str, Any], path: str, problems: list[str]):
    if not isinstance(data, Mapping):
        problems.append(f"{path or '<root>'}: expected a section of keys, got {data!r}")
        return cls()
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        dotted = f"{path}.{key}" if path else str(key)
        if key not in names:
            problems.append(f"unknown key '{dotted}'." + did_you_mean(key, names) + _list_keys(path, names))
            continue
        kwargs[key] = _convert(hints[key], value, dotted, problems)
    return cls(**kwargs)


def _list_keys(path: str, names: list[str]) -> str:
    return f" Keys under '{path or '<root>'}': {', '.join(names)}." if len(names) <= 12 else ""


def _type_name(tp) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _convert(tp, value, path: str, problems: list[str]):
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return _build_dataclass(tp, value, path, problems)
    if origin in (Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None:
            if type(None) in options:
                return None
            problems.append(f"'{path}' must not be null")
            return None
        for option in options:
            if option is type(None):
                continue
            trial: list[str] = []
            converted = _convert(option, value, path, trial)
            if not trial:
                return converted
        problems.append(f"'{path}' = {value!r} is not a {' or '.join(_type_name(o) for o in options)}")
        return None
    if origin is list:
        (item_tp,) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            problems.append(f"'{path}' must be a list, got {value!r}")
            return []
        return [_convert(item_tp, v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, Mapping):
            problems.append(f"'{path}' must be a mapping, got {value!r}")
            return {}
        _, value_tp = typing.get_args(tp) or (str, Any)
        return {k: _convert(value_tp, v, f"{path}.{k}", problems) for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif tp is str and isinstance(value, str):
        return value
    problems.append(f"'{path}' = {value!r} must be {_type_name(tp)}")
    return value


def to_container(cfg) -> dict:
    """OmegaConf config (interpolations resolved) or mapping → plain dict."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(cfg, DictConfig):
        return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]
    return dict(cfg)


def load_yaml(
    config_name: str = "ppo_trainer", overrides: Sequence[str] = (), config_dir: str = CONFIG_DIR,
    schema: type | None = None,
):
    """Compose a config the way the entry points do (same YAML, same override grammar, the veRL compatibility table
    applied: older and differently named veRL keys read with a note, refused and unknown keys reported)."""
    from omegaconf import OmegaConf

    from verlx.config.verl_compat.compose import compose_dict

    if schema is None:
        from verlx.config.schema import PPOConfig as schema

    container, report = compose_dict(config_name, overrides, schema, config_dir)
    report.log()
    return OmegaConf.create(container)


def unknown_key_problem(cls, parts: list[str], assigns_value: bool = False) -> str | None:
    """Why `parts` is no key of `cls`, or (`assigns_value`) names a section rather than a value; None when fine."""
    problem = _unknown_key_text(cls, parts, assigns_value)
    if problem is None or not problem.startswith("unknown key '"):
        return problem
    depth = problem[len("unknown key '"):].split("'")[0].count(".")  # the first part that is no key
    return problem + _found_elsewhere(cls, parts, depth)


def _found_elsewhere(cls, parts: list[str], depth: int) -> str:
    """A key put in the wrong section (reward.custom_reward_function.path): where the schema has it instead."""
    places = _paths_of(cls, parts[depth])[:3]
    if not places:
        return ""
    example = ".".join([places[0], *parts[depth + 1:]])
    return f" '{parts[depth]}' is at {' and '.join(places)}: did you mean {example}=...?"


def _paths_of(cls, name: str, prefix: str = "", depth: int = 0) -> list[str]:
    """The dotted paths of every key called `name` in the dataclass `cls` (3 levels deep)."""
    found = []
    for field, tp in typing.get_type_hints(cls).items():
        if field not in {f.name for f in dataclasses.fields(cls)}:
            continue
        dotted = f"{prefix}{field}"
        if field == name:
            found.append(dotted)
        while typing.get_origin(tp) in (Union, types.UnionType):
            tp = next(o for o in typing.get_args(tp) if o is not type(None))
        if dataclasses.is_dataclass(tp) and depth < 3:
            found += _paths_of(tp, name, dotted + ".", depth + 1)
    return found


def _unknown_key_text(cls, parts: list[str], assigns_value: bool) -> str | None:
    tp: Any = cls
    for depth, part in enumerate(parts):
        while typing.get_origin(tp) in (Union, types.UnionType):
            tp = next(o for o in typing.get_args(tp) if o is not type(None))
        if typing.get_origin(tp) is dict or tp is Any:
            return None  # free-form mapping: any key is fine
        if not dataclasses.is_dataclass(tp):
            return f"'{'.'.join(parts)}': '{'.'.join(parts[:depth])}' is a value, not a section"
        names = [f.name for f in dataclasses.fields(tp)]
        if part not in names:
            dotted = ".".join(parts[: depth + 1])
            return f"unknown key '{dotted}'." + did_you_mean(part, names) + _list_keys(".".join(parts[:depth]), names)
        tp = typing.get_type_hints(tp)[part]
    if assigns_value and dataclasses.is_dataclass(tp):
        dotted = ".".join(parts)
        return (f"'{dotted}' is a section, not a value: set its keys, e.g. "
                f"{dotted}.{dataclasses.fields(tp)[0].name}=...")
    return None
