"""Paths as users write them: `~` and environment variables expanded, one helper for every entry point."""

from __future__ import annotations

import os


def expand_path(path: str | os.PathLike, absolute: bool = False) -> str:
    """`~` and `$VARS` expanded; with `absolute`, made absolute against the working directory (not for what may be
    a hub id such as Qwen/Qwen2.5-0.5B, which must stay relative)."""
    expanded = os.path.expanduser(os.path.expandvars(os.fspath(path)))
    return os.path.abspath(expanded) if absolute else expanded
