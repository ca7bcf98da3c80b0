"""Make a fake distribution importable: modules in sys.modules plus a dist-info so importlib.metadata sees it."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types


def module(name: str, **attrs) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
    mod.__dict__.update(attrs)
    return mod


def install(package: str, version: str, modules: dict[str, types.ModuleType], dist_dir: str):
    """Register `modules` and a `<package>-<version>.dist-info` under dist_dir; returns an undo function."""
    info = os.path.join(dist_dir, f"{package}-{version}.dist-info")
    os.makedirs(info, exist_ok=True)
    with open(os.path.join(info, "METADATA"), "w") as f:
        f.write(f"Metadata-Version: 2.1\nName: {package}\nVersion: {version}\n")
    saved = {name: sys.modules.get(name) for name in modules}
    sys.modules.update(modules)
    sys.path.insert(0, dist_dir)

    def undo() -> None:
        sys.path.remove(dist_dir)
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old

    return undo
