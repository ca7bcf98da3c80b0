"""Command lines written for older veRL releases: keys that moved, deprecated aliases, and `+key=value` for a key
that exists now. Each is accepted with a one-line warning saying what it became, rather than failing."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Union


@dataclass(frozen=True)
class Moved:
    """`old` (a key or a section) is now `new`: the override is rewritten."""

    old: str
    new: str
    why: str


@dataclass(frozen=True)
class Alias:
    """`old` is still read, as `meaning` says; the override is kept as it is."""

    old: str
    meaning: str


MOVED = (
    Moved("ray_init", "ray_kwargs.ray_init", "veRL moved ray.init's options under ray_kwargs"),
    Moved("actor_rollout_ref.actor.optim.warmup_style", "actor_rollout_ref.actor.optim.lr_scheduler_type",
          "veRL renamed warmup_style to lr_scheduler_type"),
    Moved("critic.optim.warmup_style", "critic.optim.lr_scheduler_type",
          "veRL renamed warmup_style to lr_scheduler_type"),
)

_GLOBAL_MICRO = "veRL's deprecated global micro-batch size; it is read as {new} = this value / the data-parallel size"
ALIASES = (
    Alias("actor_rollout_ref.actor.ppo_micro_batch_size",
          _GLOBAL_MICRO.format(new="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")),
    Alias("critic.ppo_micro_batch_size", _GLOBAL_MICRO.format(new="critic.ppo_micro_batch_size_per_gpu")),
    Alias("critic.forward_micro_batch_size", _GLOBAL_MICRO.format(new="critic.forward_micro_batch_size_per_gpu")),
    Alias("actor_rollout_ref.rollout.log_prob_micro_batch_size",
          _GLOBAL_MICRO.format(new="actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu")),
    Alias("actor_rollout_ref.ref.log_prob_micro_batch_size",
          _GLOBAL_MICRO.format(new="actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu")),
    Alias("reward_model.micro_batch_size", _GLOBAL_MICRO.format(new="reward_model.micro_batch_size_per_gpu")),
)

# prefix (+, ++ or ~), key, and the rest ("=value", or nothing for a deletion)
_OVERRIDE = re.compile(r"^(\+\+|\+|~)?([A-Za-z_][\w.\-]*)(=.*)?$", re.S)


def upgrade_overrides(overrides: Sequence[str], schema: type) -> tuple[list[str], list[str]]:
    """The overrides with older veRL keys rewritten to today's, and one warning per rewritten or deprecated key."""
    upgraded, warnings = [], []
    for override in overrides:
        match = _OVERRIDE.match(override)
        if match is None:
            upgraded.append(override)
            continue
        prefix, key, rest = match.group(1) or "", match.group(2), match.group(3) or ""
        notes = []
        moved = next((m for m in MOVED if key == m.old or key.startswith(m.old + ".")), None)
        if moved is not None:
            key = moved.new + key[len(moved.old):]
            notes.append(f"{moved.old} became {moved.new} ({moved.why})")
        if prefix == "+" and rest and is_declared(schema, key):
            prefix = ""
            notes.append(f"{key} exists now, so the '+' (add a new key) is dropped")
        alias = next((a for a in ALIASES if key == a.old), None)
        if alias is not None and prefix != "~" and rest.lower() != "=null":
            notes.append(f"{key} is {alias.meaning}")
        new = prefix + key + rest
        upgraded.append(new)
        if notes:
            head = f"'{override}' is read as '{new}'" if new != override else f"'{override}'"
            warnings.append(f"{head}: " + "; ".join(notes))
    return upgraded, warnings


def is_declared(schema: type, key: str) -> bool:
    """True when `key` is a field of the typed config (not a new key in a free-form mapping)."""
    tp: Any = schema
    for part in key.split("."):
        while typing.get_origin(tp) in (Union, types.UnionType):
            tp = next(o for o in typing.get_args(tp) if o is not type(None))
        if not dataclasses.is_dataclass(tp):
            return False
        fields = {f.name for f in dataclasses.fields(tp)}
        if part not in fields:
            return False
        tp = typing.get_type_hints(tp)[part]
    return True
