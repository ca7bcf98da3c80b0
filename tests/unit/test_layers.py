"""config/ is the ground floor: it imports no verlx package but itself and verlx.utils (imports inside functions
included), so the schema can be loaded and checked without the trainer, the workers or the registries above it."""

from __future__ import annotations

import ast
import os

import verlx

CONFIG_DIR = os.path.join(os.path.dirname(verlx.__file__), "config")
ALLOWED = ("verlx.config", "verlx.utils")


def verlx_imports(path: str) -> list[tuple[int, str]]:
    """(line, module) of every import of a verlx module in the file, at any depth."""
    with open(path) as f:
        tree = ast.parse(f.read(), path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return [(line, name) for line, name in found if name == "verlx" or name.startswith("verlx.")]


def climbing_imports(directory: str) -> list[str]:
    problems = []
    for name in sorted(os.listdir(directory)):
        if name.endswith(".py"):
            for line, module in verlx_imports(os.path.join(directory, name)):
                if not any(module == a or module.startswith(a + ".") for a in ALLOWED):
                    problems.append(f"verlx/config/{name}:{line} imports {module}")
    return problems


def test_config_imports_nothing_above_utils():
    assert climbing_imports(CONFIG_DIR) == []


def test_the_scan_sees_imports_inside_functions(tmp_path):
    (tmp_path / "x.py").write_text("import os\nfrom verlx.utils.paths import expand_path\n\n"
                                   "def f():\n    from verlx.algorithms.advantages import uses_critic\n")
    assert climbing_imports(str(tmp_path)) == ["verlx/config/x.py:5 imports verlx.algorithms.advantages"]
