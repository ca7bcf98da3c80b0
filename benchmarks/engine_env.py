"""The environment of one engine's process: its own bundle first on PYTHONPATH, the other engines' bundles removed.

SGLang and vLLM pin different packages (transformers, flashinfer, ...), so a benchmark that compares them runs each
in its own process; `paths` maps an engine name to the directory its bundle was unpacked into.
"""

from __future__ import annotations

import os


def engine_env(engine: str, paths: dict[str, str], root: str, **extra: str) -> dict[str, str]:
    others = set(paths.values()) - {paths.get(engine)}
    parts = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p not in others]
    if engine in paths:
        parts.insert(0, paths[engine])
    return {**os.environ, "PYTHONPATH": os.pathsep.join([root, *parts]), **extra}
