"""The directories a run writes to, created and tested for writing before Ray starts: a path that cannot be used
fails in seconds naming its key, not after the model is built (output_dir) or `save_freq` steps of training
(default_local_dir)."""

from __future__ import annotations

import os
import uuid

from verlx.config.loader import ConfigError
from verlx.utils.errors import describe_os_error
from verlx.utils.paths import expand_path


def output_dirs(config) -> list[tuple[str, str]]:
    """(key, path) of each directory this PPO run writes to."""
    t = config.trainer
    dirs = [("trainer.default_local_dir", t.default_local_dir)]
    if "file" in t.loggers or "tensorboard" in t.loggers:
        dirs.append(("trainer.output_dir", t.output_dir))
    dirs += [(f"trainer.{key}", getattr(t, key)) for key in ("rollout_data_dir", "validation_data_dir")
             if getattr(t, key)]
    server = config.actor_rollout_ref.rollout.server
    if server.enable and server.log_dir:
        dirs.append(("actor_rollout_ref.rollout.server.log_dir", server.log_dir))
    return dirs


def directory_problem(key: str, path: str) -> str | None:
    """Why `path` cannot be created or written to (naming `key`), or None after creating it and writing a probe."""
    directory = expand_path(path, absolute=True)
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, f".verlx-write-test-{uuid.uuid4().hex}")
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        blocker = _file_in_the_way(directory)
        why = f"{blocker} is a file, not a directory" if blocker else describe_os_error(e)
        return f"{key}={path}: cannot create or write to {directory}: {why}; choose a directory this user can write to"
    return None


def _file_in_the_way(directory: str) -> str | None:
    """The nearest existing ancestor (or the path itself) when it is not a directory."""
    probe = directory
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    return probe if os.path.exists(probe) and not os.path.isdir(probe) else None


def prepare_output_dirs(config) -> None:
    """Create every output directory, or raise ConfigError naming each one that cannot be used."""
    problems = [p for key, path in output_dirs(config) if (p := directory_problem(key, path))]
    if problems:
        raise ConfigError(problems)
