"""Objects from users' own code, named the way veRL's config keys name them: a Python file path (`file://` optional)
or `pkg://package.module` (an importable module), plus an attribute name."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys

from verlx.utils.paths import expand_path

PKG_PREFIX, FILE_PREFIX = "pkg://", "file://"


def import_file(path: str, key: str):
    """Import a Python file as a uniquely named module (two files with one base name must not collide); `key` is
    the config key named in errors."""
    digest = hashlib.sha1(path.encode()).hexdigest()[:12]
    module_name = f"verlx_user_{os.path.splitext(os.path.basename(path))[0]}_{digest}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"{key}={path} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        del sys.modules[module_name]
        raise ImportError(f"importing {key}={path} failed: {type(e).__name__}: {e}") from e
    return module


def import_location(location: str, key: str):
    """The module at `location`: pkg://package.module (or package/module), else a file path."""
    if location.startswith(PKG_PREFIX):
        name = location[len(PKG_PREFIX):].replace("/", ".")
        try:
            return importlib.import_module(name)
        except ImportError as e:
            raise ImportError(f"{key}={location}: cannot import module {name!r}: {e}") from e
    path = expand_path(location.removeprefix(FILE_PREFIX), absolute=True)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"{key}={location}: file {path} does not exist; give a Python file or "
                                "pkg://package.module")
    return import_file(path, key)


def load_object(location: str, name: str | None, key: str, name_key: str):
    """Attribute `name` of the module at `location`; errors name `key` / `name_key` and what the module defines."""
    if not name:
        raise ValueError(f"{key}={location} is set but {name_key} is not: name the class to load from it")
    module = import_location(location, key)
    if not hasattr(module, name):
        defined = sorted(k for k, v in vars(module).items() if isinstance(v, type) and
                         getattr(v, "__module__", None) == module.__name__)
        raise AttributeError(f"{name_key}={name} is not defined in {key}={location}; classes defined there: "
                             f"{', '.join(defined) or '(none)'}")
    return getattr(module, name)
