"""Temporary environment changes, for libraries that read (or write) the environment while they start up."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator


@contextlib.contextmanager
def scoped_environ(updates: dict[str, str | None], restore: Iterable[str] = ()) -> Iterator[None]:
    """Apply `updates` (None unsets a variable) and, on exit, put back the previous values of the updated keys
    and of `restore` (variables the code inside is known to overwrite)."""
    keys = set(updates) | set(restore)
    saved = {k: os.environ.get(k) for k in keys}
    try:
        for key, value in updates.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
