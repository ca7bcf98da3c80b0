"""The layers of docs/architecture.md hold for every package: no import climbs to a higher layer and no two packages
import each other (imports inside functions included); the layer of each package is declared once, in
benchmarks/structure.py, which also prints these numbers. config/ is stricter: it imports no verlx package but itself
and verlx.utils, so the schema can be loaded and checked without the trainer, the workers or the registries above it."""

from __future__ import annotations

import ast
import importlib
import os
import sys

import verlx

VERLX_DIR = os.path.dirname(verlx.__file__)
CONFIG_DIR = os.path.join(VERLX_DIR, "config")
BENCHMARKS = os.path.join(os.path.dirname(VERLX_DIR), "benchmarks")
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


def _structure():
    if BENCHMARKS not in sys.path:
        sys.path.insert(0, BENCHMARKS)
    return importlib.import_module("structure")


def test_every_package_has_a_layer():
    structure = _structure()
    packages = structure.report(VERLX_DIR)["packages"]
    unplaced = sorted(set(packages) - set(structure.LAYERS))
    assert unplaced == [], "add the new package to LAYERS in benchmarks/structure.py"


def test_no_import_climbs_a_layer_and_no_packages_import_each_other():
    found = _structure().report(VERLX_DIR)
    assert found["upward"] == []
    assert found["package_circles"] == []


def test_the_package_scan_sees_a_utils_module_importing_config(tmp_path):
    root = tmp_path / "verlx"
    for package in ("utils", "config"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text("")
    (root / "__init__.py").write_text("")
    (root / "config" / "loader.py").write_text("from verlx.utils.paths import expand_path\n")
    (root / "utils" / "paths.py").write_text("def expand_path():\n    from verlx.config.loader import ConfigError\n")
    found = _structure().report(str(root))
    assert found["upward"] == ["verlx.utils.paths imports verlx.config.loader (utils -> config)"]
    assert found["package_circles"] == [["config", "utils"]]


def test_structure_counts_long_functions_and_duplicated_blocks(tmp_path):
    structure = _structure()
    body = "".join(f"    x{i} = {i}\n" for i in range(60))
    (tmp_path / "long.py").write_text(f"def long():\n{body}\n\ndef short():\n    return 1\n")
    assert structure.long_functions(str(tmp_path / "long.py")) == [("long", 61)]
    block = "".join(f"y{i} = f({i})\n" for i in range(7))
    (tmp_path / "a.py").write_text("import os\n" + block + "z = 1\n")
    (tmp_path / "b.py").write_text("# another\n\n" + block)
    (tmp_path / "c.py").write_text(block[: block.index("y5")])  # 5 lines: below the window
    found = structure.duplicated_blocks([str(tmp_path / n) for n in ("a.py", "b.py", "c.py")])
    assert found == [[(str(tmp_path / "a.py"), 0), (str(tmp_path / "b.py"), 0)]]
