"""The package structure in numbers: packages and their lines, import circles, imports that climb the layers, the
files whose code (comments and docstrings left out) names each rollout engine (what adding or changing an engine
touches), the largest file, functions over 60 lines and duplicated blocks (at least 6 identical code lines in two
places; blank lines, comments and imports left out, overlapping windows merged into one block).

    python benchmarks/structure.py [--root verlx]

Layers, top to bottom (docs/architecture.md): an import of a package in a higher layer is an upward import.
Circles are reported twice: between packages (any import, inside functions included) and between modules (imports
at module level only, the ones Python resolves at import time).
"""

from __future__ import annotations

import argparse
import ast
import os
import re
from collections import defaultdict

#: the layer of each top-level package (higher imports lower); modules directly under verlx/ go by their stem
LAYERS = {
    "verlx": 10,
    "trainer": 9, "tools": 9, "experimental": 9, "model_merger": 9, "quickstart": 9,
    "reward": 8, "data": 8,
    "workers": 7,
    "rollout": 6,
    "models": 5, "metrics": 5,
    "algorithms": 4, "single_controller": 4,
    "config": 3,
    "utils": 2,
    "protocol": 1, "batch_columns": 1,
}
ENGINES = ("native", "sglang", "vllm")
LONG_FUNCTION = 60
DUPLICATE_WINDOW = 6


def modules(root: str) -> dict[str, str]:
    """Dotted module name -> file path of every .py file under root."""
    out = {}
    base = os.path.dirname(os.path.abspath(root))
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                dotted = os.path.relpath(path, base)[:-3].replace(os.sep, ".")
                out[dotted.removesuffix(".__init__")] = path
    return out


def parse(path: str) -> ast.Module:
    """ast.parse of the file. CPython 3.11 keeps the AST builder's recursion counter per interpreter, so a compile in
    another thread (a test's leftover compile workers) can make a parse raise "AST constructor recursion depth
    mismatch" (CPython gh-106905): that parse is repeated, once."""
    source = _read(path)
    try:
        return ast.parse(source, path)
    except SystemError as e:
        if "recursion depth mismatch" not in str(e):
            raise
        return ast.parse(source, path)


def imports(path: str, top_level_only: bool) -> set[str]:
    tree = parse(path)
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _code(path: str) -> str:
    """The module's code without comments and docstrings (what it does, not what it says)."""
    tree = parse(path)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and \
                isinstance(getattr(body[0], "value", None), ast.Constant) and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.unparse(tree)


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def resolve(name: str, known: dict[str, str]) -> str | None:
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's components of more than one node (or a node importing itself)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def long_functions(path: str) -> list[tuple[str, int]]:
    """(name, lines) of every function or method longer than LONG_FUNCTION lines (nested ones on their own)."""
    tree = parse(path)
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(tree)
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.end_lineno - node.lineno + 1 > LONG_FUNCTION]


def _code_lines(path: str) -> list[str]:
    out = []
    for line in _read(path).splitlines():
        text = line.strip()
        if text and not text.startswith(("#", "import ", "from ")):
            out.append(text)
    return out


def duplicated_blocks(paths: list[str]) -> list[list[tuple[str, int]]]:
    """Groups of places (file, index of the block's first code line) holding the same run of at least
    DUPLICATE_WINDOW code lines."""
    lines = {path: _code_lines(path) for path in paths}
    windows = defaultdict(list)
    for path, code in lines.items():
        for i in range(len(code) - DUPLICATE_WINDOW + 1):
            windows[tuple(code[i:i + DUPLICATE_WINDOW])].append((path, i))
    repeated = {place for places in windows.values() if len(places) > 1 for place in places}
    groups = defaultdict(list)
    for path, code in lines.items():
        i = 0
        while i < len(code):
            if (path, i) in repeated and (path, i - 1) not in repeated:
                groups[tuple(code[i:i + DUPLICATE_WINDOW])].append((path, i))
            i += 1
    return [places for places in groups.values() if len(places) > 1]


def report(root: str) -> dict:
    known = modules(root)
    lines = defaultdict(int)
    files = defaultdict(int)
    package_graph: dict[str, set[str]] = defaultdict(set)
    module_graph: dict[str, set[str]] = defaultdict(set)
    upward = []
    for module, path in known.items():
        package = package_of(module)
        with open(path) as f:
            lines[package] += sum(1 for _ in f)
        files[package] += 1
        targets = {resolve(name, known) for name in imports(path, top_level_only=False)} - {None, module}
        for target in sorted(targets):
            other = package_of(target)
            if other not in (package, "verlx"):
                package_graph[package].add(other)
                if LAYERS.get(other, 0) > LAYERS.get(package, 0):
                    upward.append(f"{module} imports {target} ({package} -> {other})")
        for name in imports(path, top_level_only=True):
            target = resolve(name, known)
            if target is not None and target != module:
                module_graph[module].add(target)
    engine_files = {}
    for engine in ENGINES:
        pattern = re.compile(rf"\b{engine}\b", re.IGNORECASE)
        engine_files[engine] = sorted(
            os.path.relpath(path, os.path.dirname(os.path.abspath(root))) for path in known.values()
            if pattern.search(_code(path)))
    sizes = {os.path.relpath(path, os.path.dirname(os.path.abspath(root))): len(_read(path).splitlines())
             for path in known.values()}
    long = sorted((f"{os.path.relpath(path, os.path.dirname(os.path.abspath(root)))}:{name}", n)
                  for path in known.values() for name, n in long_functions(path))
    return {
        "largest_file": max(sizes.items(), key=lambda item: item[1]),
        "long_functions": long,
        "duplicates": duplicated_blocks(sorted(known.values())),
        "packages": {p: (files[p], lines[p]) for p in sorted(lines, key=lambda p: -LAYERS.get(p, 0))},
        "package_circles": strongly_connected(package_graph),
        "module_circles": strongly_connected(module_graph),
        "upward": sorted(upward),
        "engine_files": engine_files,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=os.path.join(os.path.dirname(__file__), "..", "verlx"))
    parser.add_argument("--verbose", action="store_true", help="list every upward import and engine file")
    args = parser.parse_args()
    r = report(os.path.normpath(args.root))
    total_files = sum(f for f, _ in r["packages"].values())
    total_lines = sum(n for _, n in r["packages"].values())
    print(f"packages: {len(r['packages'])}, files: {total_files}, lines: {total_lines}")
    for package, (n_files, n_lines) in r["packages"].items():
        print(f"  {package:<18} layer {LAYERS.get(package, '?')!s:>2}  {n_files:>3} files  {n_lines:>6} lines")
    print(f"package circles: {len(r['package_circles'])}")
    for circle in r["package_circles"]:
        print("  " + " <-> ".join(circle))
    print(f"module circles (module-level imports): {len(r['module_circles'])}")
    for circle in r["module_circles"]:
        print("  " + " <-> ".join(circle))
    print(f"upward imports: {len(r['upward'])}")
    pairs = defaultdict(int)
    for line in r["upward"]:
        pairs[line.rsplit("(", 1)[1].rstrip(")")] += 1
    for pair, count in sorted(pairs.items()):
        print(f"  {pair}: {count}")
    if args.verbose:
        for line in r["upward"]:
            print("    " + line)
    print(f"largest file: {r['largest_file'][0]} ({r['largest_file'][1]} lines)")
    print(f"functions over {LONG_FUNCTION} lines: {len(r['long_functions'])}")
    for name, n in r["long_functions"]:
        print(f"  {name} ({n})")
    places = sum(len(group) for group in r["duplicates"])
    print(f"duplicated blocks (>= {DUPLICATE_WINDOW} identical code lines): {len(r['duplicates'])} in {places} places")
    if args.verbose:
        for group in r["duplicates"]:
            print("    " + ", ".join(f"{os.path.relpath(p)}#{i}" for p, i in group))
    for engine, paths in r["engine_files"].items():
        own = [p for p in paths if engine in os.path.basename(p) or f"/{engine}/" in p]
        print(f"files naming '{engine}': {len(paths)} ({len(own)} its own, {len(paths) - len(own)} elsewhere)")
        if args.verbose:
            for path in paths:
                print("    " + path)


if __name__ == "__main__":
    main()
