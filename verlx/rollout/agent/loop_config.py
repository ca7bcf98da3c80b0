"""rollout.agent.agent_loop_config_path: veRL's file of named agent loops, a YAML list of `{name, _target_}` entries
(`_target_` the loop's class, `package.module.Class` or `package.module:Class`), whose names samples choose in their
agent_name column or rollout.agent.default_agent_loop names. A name the file lacks is looked up in AGENT_LOOPS
(verlx's loops, or a 'package.module:Class' of your own)."""

from __future__ import annotations

import functools
import os

from verlx.rollout.agent.loops import AGENT_LOOPS, AgentLoop

KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


@functools.lru_cache(maxsize=8)
def named_loops(path: str) -> dict[str, str]:
    """{name: 'package.module:Class'} of the file's entries; errors name the file and the entry."""
    import yaml

    if not os.path.isfile(os.path.expanduser(path)):
        raise ValueError(f"{KEY}: file {path!r} does not exist")
    with open(os.path.expanduser(path)) as f:
        entries = yaml.safe_load(f) or []
    if not isinstance(entries, list):
        raise ValueError(f"{KEY}: {path} holds {type(entries).__name__}; expected a list of {{name, _target_}} "
                         "entries (veRL's agent loop config)")
    loops: dict[str, str] = {}
    for i, entry in enumerate(entries):
        target = entry.get("_target_") if isinstance(entry, dict) else None
        if not (isinstance(entry, dict) and isinstance(entry.get("name"), str) and isinstance(target, str)):
            raise ValueError(f"{KEY}: {path} entry {i} is {entry!r}; expected {{name: ..., _target_: "
                             "package.module.Class}")
        if entry["name"] in loops:
            raise ValueError(f"{KEY}: {path} names agent loop {entry['name']!r} twice")
        module, _, cls = target.rpartition(":" if ":" in target else ".")
        loops[entry["name"]] = f"{module}:{cls}"
    return loops


def agent_loop_class(name: str, config_path: str | None) -> type[AgentLoop]:
    """The class of agent loop `name` (from the config file, else the registry); a clear error when it is none."""
    target = named_loops(config_path).get(name, name) if config_path else name
    cls = AGENT_LOOPS.get(target)
    if not (isinstance(cls, type) and issubclass(cls, AgentLoop)):
        raise TypeError(f"agent loop {name!r} ({target}) is not an AgentLoop subclass (verlx.rollout.agent.loops)")
    return cls
