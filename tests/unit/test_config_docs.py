"""Every YAML key is documented by the comment above it, and docs/config.md is generated from those comments."""

from __future__ import annotations

import os

import pytest

from verlx.config.loader import CONFIG_DIR
from verlx.config.reference import CONFIG_FILES, key_docs, render, undocumented

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
YAMLS = sorted(f for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


def test_the_reference_covers_every_config_file():
    assert sorted(CONFIG_FILES) == YAMLS


@pytest.mark.parametrize("name", YAMLS)
def test_every_key_has_a_comment_above_it(name):
    assert undocumented(os.path.join(CONFIG_DIR, name)) == []


def test_parser_finds_nested_paths_and_their_comments(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("# Section A.\na:\n  # The b key.\n  b: 1\n\n  c: [1, 2]\n# D.\nd: x\n")
    docs = [(d.path, d.value, d.comment) for d in key_docs(str(path))]
    assert docs == [("a", "", "Section A."), ("a.b", "1", "The b key."), ("a.c", "[1, 2]", ""), ("d", "x", "D.")]
    assert undocumented(str(path)) == ["line 6: a.c"]


def test_docs_config_md_is_up_to_date():
    with open(os.path.join(REPO, "docs", "config.md")) as f:
        assert f.read() == render(), "regenerate with: python -m verlx.config.reference > docs/config.md"
