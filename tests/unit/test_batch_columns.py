"""The batch's column names live in verlx/batch_columns.py: every literal name the code indexes a batch with is
declared there, and the lists of columns the phases read are defined once."""

from __future__ import annotations

import ast
import os

import verlx
from verlx import batch_columns

VERLX_DIR = os.path.dirname(verlx.__file__)


def literal_columns(root: str) -> dict[str, set[str]]:
    """Literal keys of `<x>.batch[...]`, `<x>.non_tensor_batch[...]` and `batch[...]` subscripts -> their files."""
    found: dict[str, set[str]] = {}
    for folder, _, files in os.walk(root):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(folder, name)
            with open(path) as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if not (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant)
                        and isinstance(node.slice.value, str)):
                    continue
                target = node.value
                if (isinstance(target, ast.Attribute) and target.attr in ("batch", "non_tensor_batch")) or \
                        (isinstance(target, ast.Name) and target.id == "batch"):
                    found.setdefault(node.slice.value, set()).add(os.path.relpath(path, root))
    return found


def test_every_column_the_code_indexes_is_declared():
    undeclared = {k: sorted(v) for k, v in literal_columns(VERLX_DIR).items() if k not in batch_columns.COLUMNS}
    assert undeclared == {}, "declare these columns in verlx/batch_columns.py"


def test_the_scan_sees_an_undeclared_column(tmp_path):
    (tmp_path / "phase.py").write_text("def f(data, batch):\n    data.batch['old_log_prob'] = batch['values']\n"
                                       "    return data.non_tensor_batch['uid']\n")
    assert literal_columns(str(tmp_path)) == {"old_log_prob": {"phase.py"}, "values": {"phase.py"},
                                              "uid": {"phase.py"}}
    assert "old_log_prob" not in batch_columns.COLUMNS


def test_the_column_lists_are_built_from_the_names():
    assert batch_columns.MODEL_INPUTS == ("input_ids", "attention_mask", "position_ids")
    assert batch_columns.LOG_PROB_INPUTS == ("input_ids", "attention_mask", "position_ids", "responses",
                                             "response_mask")
    assert set(batch_columns.MODEL_INPUTS + batch_columns.LOG_PROB_INPUTS + batch_columns.PARTIAL_COLUMNS) <= \
        set(batch_columns.COLUMNS)


def test_no_other_module_defines_the_model_inputs_again():
    again = []
    for folder, _, files in os.walk(VERLX_DIR):
        for name in files:
            path = os.path.join(folder, name)
            if name.endswith(".py") and path != batch_columns.__file__:
                with open(path) as f:
                    if '("input_ids", "attention_mask", "position_ids"' in f.read():
                        again.append(os.path.relpath(path, VERLX_DIR))
    assert again == []
