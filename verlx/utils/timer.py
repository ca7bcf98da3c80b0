"""Wall-clock timing of driver phases into a metrics dict."""

from __future__ import annotations

import time
from contextlib import contextmanager


@contextmanager
def timed(name: str, timing: dict[str, float]):
    start = time.perf_counter()
    try:
        yield
    finally:
        timing[name] = timing.get(name, 0.0) + time.perf_counter() - start
