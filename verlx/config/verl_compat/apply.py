"""The compatibility table applied: to command-line overrides before Hydra composes, then to the composed config.

Overrides are rewritten so that Hydra accepts every one the table knows (moved keys renamed, ignored keys dropped,
`+` on a key verlx has dropped, and `++` for the rest, so that Hydra never fails with its bare "Could not
override"); what is left to judge (refused keys, unknown keys, keys that a script's own YAML sets) is judged on the
composed config, where each problem names the command-line override or the YAML file and line it came from.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import re
from collections.abc import Callable, Sequence
from typing import Any

from verlx.config.legacy_keys import (
    Alias,
    Ignored,
    Joined,
    KeyTable,
    Moved,
    Refused,
    field_type,
    in_free_form,
    is_declared,
)

logger = logging.getLogger("verlx.config")
# prefix (+, ++ or ~), key, and the rest ("=value", or nothing for a deletion)
OVERRIDE = re.compile(r"^(\+\+|\+|~)?([A-Za-z_][\w.\-]*)(=.*)?$", re.S)
# a config-group choice placed at a package: group@package=option
GROUP_AT = re.compile(r"^(?:\+\+|\+)?([\w/]+)@[\w.]+=([\w/]+)$")


@dataclasses.dataclass
class Report:
    """What the table did, logged once when the run starts (one line per message), and the problems it found."""

    lines: dict[str, int] = dataclasses.field(default_factory=dict)
    problems: list[str] = dataclasses.field(default_factory=list)

    def note(self, level: int, message: str) -> None:
        self.lines.setdefault(message, level)

    def problem(self, message: str) -> None:
        if message not in self.problems:
            self.problems.append(message)

    def extend(self, other: Report) -> None:
        for message, level in other.lines.items():
            self.note(level, message)
        for message in other.problems:
            self.problem(message)

    def log(self) -> None:
        for message, level in self.lines.items():
            logger.log(level, message)

    def messages(self, level: int) -> list[str]:
        return [m for m, lvl in self.lines.items() if lvl == level]


def follow(table: KeyTable, key: str) -> tuple[str, list[Moved], Any]:
    """The key after every Moved row it passes through, those rows, and the row of the final key."""
    moves: list[Moved] = []
    row = table.row_for(key)
    while isinstance(row, Moved) and len(moves) < 4:
        moves.append(row)
        key = row.new + key[len(row.old):]
        row = table.row_for(key)
    return key, moves, row


def prepare_overrides(overrides: Sequence[str], schema: type, table: KeyTable, groups: Sequence[str] = (),
                      options: dict[str, dict[str, str | None]] | None = None) -> tuple[list[str], Report]:
    """Overrides Hydra accepts, and the report of what was rewritten or dropped (refusals of keys come later, on
    the composed config). `groups` are verlx's Hydra config groups; `options` veRL's groups this entry point
    answers without one (engine=fsdp in SFT: dropped, what verlx does anyway; engine=megatron: refused)."""
    from verlx.config.verl_compat import option_problem

    report, prepared = Report(), []
    for override in overrides:
        override = moved_onto_group(override, table, groups, options or {}, report)
        at = GROUP_AT.match(override)
        if at and at.group(1) in (options or {}) and (options or {})[at.group(1)].get(at.group(2)):
            report.problem(option_problem(at.group(1), at.group(2), options[at.group(1)]))
            continue
        match = OVERRIDE.match(override)
        if match is None or match.group(2).split(".")[0] == "hydra" or match.group(2) in groups:
            prepared.append(override)  # Hydra's own settings, config-group choices, sweeps Hydra parses itself
            continue
        prefix, key, rest = match.group(1) or "", match.group(2), match.group(3) or ""
        choices = (options or {}).get(key)
        if choices is not None and rest[1:] in choices and prefix != "~":
            if choices[rest[1:]] is None:
                report.note(logging.INFO, f"'{override}' is dropped: it is what verlx runs anyway")
            else:
                report.problem(option_problem(key, rest[1:], choices))
            continue
        new_key, moves, row = follow(table, key)
        notes = [(m.level, f"{m.old} became {m.new} ({m.why})") for m in moves]
        declared = is_declared(schema, new_key)
        if isinstance(row, Ignored) and not declared:
            report.note(logging.INFO if row.quiet else logging.WARNING, f"'{override}' is ignored: {row.why}")
            continue
        if isinstance(row, Alias) and prefix != "~" and rest.lower() != "=null":
            notes.append((logging.WARNING, f"{new_key} is {row.meaning}"))
        if prefix == "~" and not (declared or in_free_form(schema, new_key)):
            report.note(logging.INFO, f"'{override}' is dropped: verlx has no key {new_key} to delete")
            continue
        if prefix == "+" and declared:
            notes.append((logging.WARNING, f"{new_key} exists now, so the '+' (add a new key) is dropped"))
        shown = ("~" if prefix == "~" else "+" if prefix == "+" and not declared else "") + new_key + rest
        prepared.append(("~" if prefix == "~" else "++") + new_key + rest)
        if notes:
            head = f"'{override}' is read as '{shown}'" if shown != override else f"'{override}'"
            report.note(max(level for level, _ in notes), f"{head}: " + "; ".join(text for _, text in notes))
    return prepared, report


def moved_onto_group(override: str, table: KeyTable, groups: Sequence[str], options: dict, report: Report) -> str:
    """A key the table moves onto a config group (actor_rollout_ref.actor.model_engine=megatron, as veRL's examples
    README writes it) becomes that group's choice (model_engine=megatron), with a line saying so."""
    match = OVERRIDE.match(override)
    if match is None or match.group(1) == "~" or not match.group(3):
        return override
    new_key, moves, _ = follow(table, match.group(2))
    if not moves or not (new_key in groups or new_key in options):
        return override
    choice = new_key + match.group(3)
    report.note(max(m.level for m in moves),
                f"'{override}' is read as '{choice}': " + "; ".join(m.why for m in moves))
    return choice


class Origins:
    """Where a key of the composed config was set: a command-line override, or a line of a script's own YAML."""

    def __init__(self, overrides: Sequence[str] = (), yaml_files: Sequence[str] = ()):
        self.overrides = [(m.group(2), o) for o in overrides if (m := OVERRIDE.match(o))]
        self.yaml_files = list(yaml_files)
        self._yaml_keys: dict[str, str] | None = None

    def where(self, key: str) -> str:
        for set_key, text in reversed(self.overrides):
            if key == set_key or key.startswith(set_key + ".") or set_key.startswith(key + "."):
                return f"command line: '{text}'"
        found = self._keys_in_yaml().get(key)
        if found is None:
            found = next((place for k, place in self._keys_in_yaml().items() if k.startswith(key + ".")), None)
        return found or ""

    def written(self, text: str) -> str:
        """The first `file:line` of a script's own YAML that contains `text`."""
        for path in self.yaml_files:
            with open(path) as f:
                for number, line in enumerate(f, 1):
                    if text in line:
                        return f"{path}:{number}"
        return ""

    def _keys_in_yaml(self) -> dict[str, str]:
        if self._yaml_keys is None:
            from verlx.config.reference import key_docs

            self._yaml_keys = {}
            for path in self.yaml_files:
                for doc in key_docs(path):
                    self._yaml_keys.setdefault(doc.path, f"{path}:{doc.line}")
        return self._yaml_keys


@dataclasses.dataclass
class Translation:
    """One pass of the table over a composed config (plain, unresolved containers)."""

    schema: type
    table: KeyTable
    origins: Origins
    resolved: Callable[[str, Any], Any]
    unknown: Callable[[str], str]
    report: Report = dataclasses.field(default_factory=Report)
    moves: list[tuple[str, Any]] = dataclasses.field(default_factory=list)
    unknown_seen: set[str] = dataclasses.field(default_factory=set)

    def visit(self, node: dict, path: str = "") -> None:
        for key in list(node):
            dotted = f"{path}.{key}" if path else str(key)
            value = node[key]
            row = self.table.row_for(dotted)
            declared = is_declared(self.schema, dotted)
            if declared and not isinstance(row, Refused):
                if isinstance(value, dict) and dataclasses.is_dataclass(field_type(self.schema, dotted)):
                    self.visit(value, dotted)
                continue
            if declared or in_free_form(self.schema, dotted):
                if isinstance(row, Refused):
                    self.judge(row, dotted, value, quiet=True)  # verlx's own default: no warning
                continue
            if row is None and isinstance(value, dict) and value:
                self.visit(value, dotted)
                if not value:
                    del node[key]
                continue
            del node[key]
            self.apply(row, dotted, value)

    def apply(self, row, dotted: str, value: Any) -> None:
        if row is None:
            message = self.unknown(dotted)  # names the first unknown part: one problem per unknown section
            if message not in self.unknown_seen:
                self.unknown_seen.add(message)
                self.report.problem(message + self._at(dotted))
        elif isinstance(row, Moved):
            new = row.new + dotted[len(row.old):]
            self.moves.append((new, value))
            self.report.note(row.level, f"{dotted} is read as {new} ({row.why})")
        elif isinstance(row, Ignored):
            self.judge_refused_within(dotted, value)
            self.report.note(logging.INFO if row.quiet else logging.WARNING, f"{dotted} is ignored: {row.why}")
        elif isinstance(row, Refused):
            self.judge(row, dotted, value)
        elif isinstance(row, Joined):
            self.join(row, dotted, self.resolved(dotted, value))

    def judge_refused_within(self, dotted: str, value: Any) -> None:
        """An ignored section may hold keys refused on their own (SFT's engine.param_offload under the ignored
        engine section): each of those that asks for its feature is still an error."""
        if not isinstance(value, dict):
            return
        for leaf, raw in _leaves(value, dotted):
            row = self.table.row_for(leaf)
            if isinstance(row, Refused):
                self.judge(row, leaf, raw, quiet=True)

    def join(self, row: Joined, dotted: str, fields: Any) -> None:
        if fields is None:
            return
        if not (isinstance(fields, list) and len(fields) == 1 and isinstance(fields[0], str)):
            self.report.problem(f"{dotted}={fields!r}{self._at(dotted)}: verlx reads one field of a dict column "
                                f"({row.into}=column.field); give one field")
            return
        into = f"{self.resolved(row.into, '')}.{fields[0]}"
        self.moves.append((row.into, into))
        self.report.note(logging.INFO, f"{dotted}={fields} is read as {row.into}={into} ({row.why})")

    def judge(self, row: Refused, dotted: str, value: Any, quiet: bool = False) -> None:
        """A refused key: an error when it asks for the missing feature, else a warning that it has no effect."""
        if row.switch is not None and not _on(self.resolved(row.switch, None)):
            if not quiet:
                self.report.note(logging.WARNING, f"{dotted} has no effect: it is read only with {row.switch} on, "
                                 f"and verlx does not support {row.missing} yet")
            return
        for leaf, raw in _leaves(value, dotted):
            if not row.asks_for_nothing(self.resolved(leaf, raw)):
                self.report.problem(f"{leaf}={raw!r}{self._at(leaf)}: verlx does not support {row.missing} yet "
                                    "(docs/verl_compat.md lists what is missing)")
                return
        if not quiet:
            self.report.note(logging.WARNING, f"{dotted}={value!r} is accepted and has no effect: it asks for "
                             f"nothing, and verlx does not support {row.missing} yet")

    def _at(self, key: str) -> str:
        where = self.origins.where(key)
        return f" (set at {where})" if where else ""


def _on(value: Any) -> bool:
    return value not in (None, False, 0, "", {}, [], "disabled", "none")


def _leaves(value: Any, path: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value:
        return [leaf for key, sub in value.items() for leaf in _leaves(sub, f"{path}.{key}")]
    return [(path, value)]


def translate(container: dict, schema: type, table: KeyTable, origins: Origins,
              resolved: Callable[[str, Any], Any], unknown: Callable[[str], str]) -> tuple[dict, Report]:
    """The composed config with the table applied: moved keys in their new place, ignored ones gone, refused and
    unknown ones reported (with where they were set)."""
    out = copy.deepcopy(container)
    translation = Translation(schema, table, origins, resolved, unknown)
    for _ in range(4):
        translation.visit(out)
        if not translation.moves:
            break
        for new, value in translation.moves:
            _set(out, new, value)
        translation.moves = []
    return out, translation.report


def _set(root: dict, dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = root
    for part in parents:
        node = node.setdefault(part, {})
    if isinstance(node.get(last), dict) and isinstance(value, dict):
        node[last].update(value)
    else:
        node[last] = value
