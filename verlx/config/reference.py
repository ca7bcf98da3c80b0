"""The configuration reference, generated from the comments in the YAML files.

Every key in a config YAML carries the comment lines right above it; `python -m verlx.config.reference` turns them
into docs/config.md, and tests/unit/test_config_docs.py fails when a key has no comment or the page is stale.
A section written once in a config group (e.g. rollout/rollout.yaml) and composed into a file by its Hydra defaults
list is shown under that file at its package, with the file's own values and comments winning as in Hydra.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass

from verlx.config.loader import CONFIG_DIR

KEY_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[A-Za-z_][A-Za-z0-9_]*|'[^']+'):\s*(?P<value>.*?)\s*$")
# `- group@package: option`, `- group: option` or `- override group: option` in a defaults list (a plain `- name` is
# a config or _self_)
GROUP_ENTRY = re.compile(r"^\s+-\s+(?:override\s+)?(?P<group>[\w/]+)(?:@(?P<package>[\w.]+))?\s*:\s*"
                         r"(?P<option>[\w/]+)\s*$")
# A group file's own package, `# @package _global_` on its first line (its keys are then at the root)
PACKAGE_HEADER = re.compile(r"^#\s*@package\s+(?P<package>\S+)")
# Files in the order the reference page shows them.
CONFIG_FILES = ("ppo_trainer.yaml", "ppo_megatron_trainer.yaml", "generation.yaml", "evaluation.yaml",
                "sft_trainer.yaml", "fsdp_sft_trainer.yaml", "sft_trainer_engine.yaml")


@dataclass(frozen=True)
class KeyDoc:
    path: str
    value: str
    comment: str
    line: int


def key_docs(yaml_path: str) -> list[KeyDoc]:
    """Every key of the file with its dotted path, its written value and the comment lines right above it."""
    with open(yaml_path) as f:
        lines = f.read().splitlines()
    docs, stack, comment = [], [], []
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if PACKAGE_HEADER.match(stripped):
            continue
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        match = KEY_LINE.match(line)
        if match is None or stripped.startswith("- "):
            comment = []
            continue
        indent = len(match.group("indent"))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        key = match.group("key").strip("'")
        stack.append((indent, key))
        if key == "defaults" and indent == 0:  # Hydra's composition list, not a config key
            comment = []
            continue
        docs.append(KeyDoc(".".join(k for _, k in stack), match.group("value"), " ".join(comment), number))
        comment = []
    return docs


@dataclass(frozen=True)
class GroupEntry:
    package: str
    path: str
    comment: str
    line: int


def group_entries(yaml_path: str) -> list[GroupEntry]:
    """The config groups the file's defaults list composes, each with its package, file and the comment above it.
    A group listed after _self_ would override the file's own keys, which the reference does not show: refused."""
    with open(yaml_path) as f:
        lines = f.read().splitlines()
    entries, comment, in_defaults, after_self = [], [], False, False
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if not in_defaults:
            in_defaults = line.startswith("defaults:")
            continue
        if stripped.startswith("#"):
            comment.append(stripped.lstrip("#").strip())
            continue
        if line and not line[0].isspace():
            break
        match = GROUP_ENTRY.match(line)
        after_self = after_self or stripped == "- _self_"
        if match and after_self:
            raise ValueError(f"{yaml_path}:{number}: a config group after _self_ overrides the file's own keys; "
                             "list it before _self_")
        if match:
            group = match.group("group")
            path = os.path.join(os.path.dirname(yaml_path), group, match.group("option") + ".yaml")
            package = match.group("package") or _header_package(path) or group.replace("/", ".")
            entries.append(GroupEntry("" if package == "_global_" else package, path, " ".join(comment), number))
        comment = []
    return entries


def _header_package(path: str) -> str | None:
    with open(path) as f:
        match = PACKAGE_HEADER.match(f.readline().strip())
    return match.group("package") if match else None


def composed_docs(yaml_path: str) -> list[KeyDoc]:
    """The file's keys with those of its config groups spliced in, in reading order: a group's keys under its package
    in the group file's order, the file's own value and comment winning where both set a key (its _self_ comes
    last, as in Hydra); a package the file has stays where the file has it, one it has not follows its parent's own
    keys."""
    root = _tree(key_docs(yaml_path))
    for entry in group_entries(yaml_path):
        if not entry.package:  # a _global_ group: merged into the file's sections, which keep their order
            root = _merge_global(_tree(key_docs(entry.path)), root)
            continue
        *parents, name = entry.package.split(".")
        parent = root
        for part in parents:
            parent = parent[1][part]
        group = (KeyDoc(entry.package, "", entry.comment, entry.line), _tree(key_docs(entry.path))[1])
        parent[1][name] = _merge(group, parent[1][name]) if name in parent[1] else group
    return _flatten(root[1], "")


def _tree(docs: list[KeyDoc]) -> tuple:
    """(doc, {key: subtree}) from the flat list, in file order."""
    root: tuple = (None, {})
    for d in docs:
        node = root
        *parents, name = d.path.split(".")
        for part in parents:
            node = node[1][part]
        node[1][name] = (d, {})
    return root


def _merge(group: tuple, own: tuple) -> tuple:
    """The group's keys in its order, the own ones winning, then the keys only the file has."""
    children = {k: _merge(sub, own[1][k]) if k in own[1] else sub for k, sub in group[1].items()}
    children.update({k: sub for k, sub in own[1].items() if k not in children})
    return own[0], children


def _merge_global(group: tuple, own: tuple) -> tuple:
    """The keys only the group has first, then the file's keys in its order (shared sections merged alike)."""
    children = {k: sub for k, sub in group[1].items() if k not in own[1]}
    children.update({k: _merge_global(group[1][k], sub) if k in group[1] else sub for k, sub in own[1].items()})
    return own[0] or group[0], children


def _flatten(children: dict, prefix: str) -> list[KeyDoc]:
    out = []
    for key, (doc, sub) in children.items():
        path = f"{prefix}{key}"
        out.append(KeyDoc(path, doc.value, doc.comment, doc.line))
        out += _flatten(sub, path + ".")
    return out


def undocumented(yaml_path: str) -> list[str]:
    """Keys, and defaults-list entries of config groups, without a comment above them."""
    return ([f"line {d.line}: {d.path}" for d in key_docs(yaml_path) if not d.comment]
            + [f"line {e.line}: defaults entry {e.package}" for e in group_entries(yaml_path) if not e.comment])


def render(config_dir: str = CONFIG_DIR) -> str:
    out = ["# Configuration reference", "",
           "Generated by `python -m verlx.config.reference > docs/config.md` from the comments in "
           "`verlx/config/*.yaml` and the sections they compose from `verlx/config/*/*.yaml`.",
           "Override any key on the command line: `python -m verlx.trainer.main_ppo section.key=value`. "
           "Unknown keys are "
           "errors with a did-you-mean; `${...}` values follow another key unless you set them.", ""]
    for name in CONFIG_FILES:
        path = os.path.join(config_dir, name)
        if not os.path.exists(path):
            continue
        out += [f"## {name}", "", "| key | default | meaning |", "|---|---|---|"]
        for doc in composed_docs(path):
            meaning = doc.comment.replace("|", "\\|")
            if doc.value:
                value = doc.value.replace("|", "\\|")
                out.append(f"| `{doc.path}` | `{value}` | {meaning} |")
            else:
                out.append(f"| **`{doc.path}`** | *(section)* | {meaning} |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    import argparse

    argparse.ArgumentParser(description=__doc__.strip().splitlines()[0]).parse_args()
    sys.stdout.write(render())
