"""The YAML files that list an agent loop's plug-ins (veRL's tool config, its interaction config): a top-level list
of entries, each built into an object with a unique name, every problem naming the file and the entry."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import yaml

from verlx.utils.paths import expand_path

logger = logging.getLogger(__name__)
# the veRL class names already said to be read as verlx's (once a process)
_said: set[str] = set()


def load_named_entries(path: str, *, config_key: str, section: str, noun: str, error: type[Exception],
                       build: Callable[[dict, str], Any], caught: tuple[type[Exception], ...] = (),
                       hint: str = "") -> dict[str, Any]:
    """name → `build(entry, where)` for every entry of the file's top-level `section:` list. A missing file, YAML
    that does not parse, a missing or empty list, an entry that is not a mapping, a build that raises one of
    `caught` (ValueError, KeyError and TypeError always) and a repeated name all raise `error`."""
    path = expand_path(path)
    if not os.path.isfile(path):
        raise error(f"{config_key}: file {path!r} does not exist")
    try:
        with open(path) as f:
            raw = yaml.safe_load(f)
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML: {e}") from None
    entries = raw.get(section) if isinstance(raw, dict) else None
    if not isinstance(entries, list) or not entries:
        raise error(f"{path}: expected a top-level '{section}:' list with at least one entry{hint}")
    made_by_name: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        where = f"{path}: {section}[{i}]"
        if not isinstance(entry, dict):
            raise error(f"{where} must be a mapping, got {entry!r:.80}")
        try:
            made = build(entry, where)
        except error:
            raise
        except (ValueError, KeyError, TypeError, *caught) as e:
            raise error(f"{where}: {e}") from None
        if made.name in made_by_name:
            raise error(f"{where}: a second {noun} named {made.name!r}; names must be unique")
        made_by_name[made.name] = made
    return made_by_name


def verlx_class_for(class_name: str, ours_by_verl: dict[str, str], noun: str) -> str:
    """`class_name`, or verlx's class for a veRL class in `ours_by_verl` (said once a process, at info level)."""
    ours = ours_by_verl.get(class_name)
    if ours is None:
        return class_name
    if class_name not in _said:
        _said.add(class_name)
        logger.info("%s class %s (veRL's) is read as verlx's %s", noun, class_name, ours)
    return ours
