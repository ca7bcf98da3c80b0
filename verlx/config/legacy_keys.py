"""The kinds of row of the veRL compatibility table (verlx.config.verl_compat) and how a key finds its row.

A veRL key that verlx's typed config declares under the same name is implemented and needs no row. Every other veRL
key has one: Moved (verlx reads it under another name: the key is rewritten, and a line says what it became),
Alias (still read as it is, with a note on what it means), Ignored (accepted, with a warning saying why it has no
meaning in verlx), Refused (an error naming the feature verlx lacks; a value that asks for nothing, such as false
or null, is accepted with a warning) or Joined (a list of dict fields read into a dotted path). A row's key may
name a whole section; `*` stands for any one part of a dotted key and `**` for one or more (`**._target_`); the
row with the most literal parts wins.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Union

# Values of a refused key that ask for nothing (the feature off, or veRL's default), accepted with a warning.
OFF_VALUES = (None, False, {}, [], "")


@dataclass(frozen=True)
class Moved:
    """`old` (a key or a section) is read as `new`. Older veRL keys are rewritten with a warning; a key of the current
    veRL release that verlx spells differently (`current=True`) with an info line."""

    old: str
    new: str
    why: str
    current: bool = False

    @property
    def key(self) -> str:
        return self.old

    @property
    def level(self) -> int:
        return logging.INFO if self.current else logging.WARNING


@dataclass(frozen=True)
class Alias:
    """`old` is still read, as `meaning` says; the override is kept as it is."""

    old: str
    meaning: str

    @property
    def key(self) -> str:
        return self.old


@dataclass(frozen=True)
class Ignored:
    """Accepted and dropped: the key has no meaning in verlx, as `why` says. `quiet` rows (veRL's `_target_` class
    names) are logged at info level rather than as warnings."""

    key: str
    why: str
    quiet: bool = False


@dataclass(frozen=True)
class Refused:
    """An error naming the feature verlx lacks (`missing`). A value in `inert` asks for nothing and is accepted with
    a warning, and so is any value while the key `switch` (the feature's on/off key, e.g. reward_model.enable) is
    off: veRL reads the key only when the feature is on. With `asked_by`, only those values ask for the feature (a
    choice key of verlx's own, such as a role's strategy, whose other values verlx's checks judge)."""

    key: str
    missing: str
    inert: tuple = OFF_VALUES
    switch: str | None = None
    asked_by: tuple | None = None

    def asks_for_nothing(self, value: Any) -> bool:
        if self.asked_by is not None:
            return not _one_of(value, self.asked_by)
        return _one_of(value, self.inert)


def _one_of(value: Any, values: tuple) -> bool:
    """`value` is one of `values`, type included (True is not 1, 0 is not False)."""
    return any(type(value) is type(v) and value == v for v in values)


@dataclass(frozen=True)
class Joined:
    """A one-element list `[field]` under `key` is read as `<into>.field`: the dotted path verlx uses for a field
    of a dict column (veRL's prompt_dict_keys=[question] with prompt_key=extra_info is extra_info.question)."""

    key: str
    into: str
    why: str


Row = Moved | Alias | Ignored | Refused | Joined


def _pattern(key: str) -> re.Pattern:
    wildcards = {"*": r"[^.]+", "**": r".+"}
    parts = [wildcards.get(part, re.escape(part)) for part in key.split(".")]
    return re.compile(r"\.".join(parts) + r"(?:\..+)?$")


class KeyTable:
    """Rows looked up by dotted key: the most specific row whose key is the key or a section above it."""

    def __init__(self, rows: Iterable[Row]):
        self.rows = tuple(rows)
        keys = [row.key for row in self.rows]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        if duplicates:
            raise ValueError(f"compatibility rows listed twice: {duplicates}")
        self._compiled = [(_pattern(row.key), _specificity(row.key), row) for row in self.rows]
        self._found: dict[str, Row | None] = {}  # every config is walked key by key: each lookup once

    def row_for(self, key: str) -> Row | None:
        if key not in self._found:
            matches = [(spec, row) for pattern, spec, row in self._compiled if pattern.match(key)]
            self._found[key] = max(matches, key=lambda m: m[0])[1] if matches else None
        return self._found[key]

    def __add__(self, other: KeyTable) -> KeyTable:
        return KeyTable(self.rows + other.rows)


def _specificity(key: str) -> tuple[int, int]:
    parts = key.split(".")
    return sum(part not in ("*", "**") for part in parts), len(parts)


@functools.cache
def _fields_of(tp: type) -> dict[str, Any]:
    """A dataclass's field names and their resolved types (typing.get_type_hints is slow, and asked per key)."""
    hints = typing.get_type_hints(tp)
    return {f.name: hints[f.name] for f in dataclasses.fields(tp)}


@functools.cache
def field_type(schema: type, key: str) -> Any:
    """The declared type of `key` in the typed config; None when the schema has no such field. Inside a free-form
    mapping (dict or Any) every key is declared, as Any."""
    tp: Any = schema
    for part in key.split("."):
        while typing.get_origin(tp) in (Union, types.UnionType):
            tp = next(o for o in typing.get_args(tp) if o is not type(None))
        if typing.get_origin(tp) is dict or tp is Any:
            return Any
        if not dataclasses.is_dataclass(tp) or part not in _fields_of(tp):
            return None
        tp = _fields_of(tp)[part]
    return tp


@functools.cache
def is_declared(schema: type, key: str) -> bool:
    """True when `key` is a field of the typed config (not a new key in a free-form mapping)."""
    tp: Any = schema
    for part in key.split("."):
        while typing.get_origin(tp) in (Union, types.UnionType):
            tp = next(o for o in typing.get_args(tp) if o is not type(None))
        if not dataclasses.is_dataclass(tp) or part not in _fields_of(tp):
            return False
        tp = _fields_of(tp)[part]
    return True


def in_free_form(schema: type, key: str) -> bool:
    """True when `key` lies inside a free-form mapping of the typed config (engine_kwargs.vllm.*, ...)."""
    return not is_declared(schema, key) and field_type(schema, key) is Any
