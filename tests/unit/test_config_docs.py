"""Every YAML key is documented by the comment above it, and docs/config.md is generated from those comments."""

from __future__ import annotations

import glob
import os

import pytest

from verlx.config.loader import CONFIG_DIR
from verlx.config.reference import CONFIG_FILES, composed_docs, group_entries, key_docs, render, undocumented

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
YAMLS = sorted(f for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))
GROUP_YAMLS = sorted(os.path.relpath(p, CONFIG_DIR) for p in glob.glob(os.path.join(CONFIG_DIR, "*", "*.yaml")))


def test_the_reference_covers_every_config_file():
    assert sorted(CONFIG_FILES) == YAMLS
    used = {os.path.relpath(e.path, CONFIG_DIR) for name in YAMLS
            for e in group_entries(os.path.join(CONFIG_DIR, name))}
    assert used == set(GROUP_YAMLS)  # every shared section is composed somewhere, so the reference shows it


@pytest.mark.parametrize("name", YAMLS + GROUP_YAMLS)
def test_every_key_has_a_comment_above_it(name):
    assert undocumented(os.path.join(CONFIG_DIR, name)) == []


def test_parser_finds_nested_paths_and_their_comments(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("# Section A.\na:\n  # The b key.\n  b: 1\n\n  c: [1, 2]\n# D.\nd: x\n")
    docs = [(d.path, d.value, d.comment) for d in key_docs(str(path))]
    assert docs == [("a", "", "Section A."), ("a.b", "1", "The b key."), ("a.c", "[1, 2]", ""), ("d", "x", "D.")]
    assert undocumented(str(path)) == ["line 6: a.c"]


def test_composed_sections_appear_in_the_files_order_with_its_own_keys_winning(tmp_path):
    (tmp_path / "sampling").mkdir()
    (tmp_path / "sampling" / "base.yaml").write_text("# Temperature.\nt: 1.0\n# Top-p.\np: 1.0\n# Seed.\ns: 0\n")
    (tmp_path / "main.yaml").write_text(
        "defaults:\n  # Sampling of the policy.\n  - sampling@policy.sampling: base\n  # Top-level sampling.\n"
        "  - sampling: base\n  - _self_\n\n# The policy.\npolicy:\n  # Its name.\n  name: x\n"
        "# Generation sampling.\nsampling:\n  # Greedy here.\n  t: 0.0\n  # Only here.\n  extra: 1\n# Last.\nz: 1\n")
    docs = [(d.path, d.value, d.comment) for d in composed_docs(str(tmp_path / "main.yaml"))]
    assert docs == [
        ("policy", "", "The policy."), ("policy.name", "x", "Its name."),
        ("policy.sampling", "", "Sampling of the policy."), ("policy.sampling.t", "1.0", "Temperature."),
        ("policy.sampling.p", "1.0", "Top-p."), ("policy.sampling.s", "0", "Seed."),
        ("sampling", "", "Generation sampling."), ("sampling.t", "0.0", "Greedy here."),
        ("sampling.p", "1.0", "Top-p."), ("sampling.s", "0", "Seed."), ("sampling.extra", "1", "Only here."),
        ("z", "1", "Last.")]


def test_an_undocumented_defaults_entry_and_a_group_after_self_are_refused(tmp_path):
    (tmp_path / "g").mkdir()
    (tmp_path / "g" / "a.yaml").write_text("# K.\nk: 1\n")
    (tmp_path / "bare.yaml").write_text("defaults:\n  - g: a\n  - _self_\n")
    assert undocumented(str(tmp_path / "bare.yaml")) == ["line 2: defaults entry g"]
    (tmp_path / "late.yaml").write_text("defaults:\n  - _self_\n  # G.\n  - g: a\n")
    with pytest.raises(ValueError, match="late.yaml:4: a config group after _self_"):
        group_entries(str(tmp_path / "late.yaml"))


def test_docs_config_md_is_up_to_date():
    with open(os.path.join(REPO, "docs", "config.md")) as f:
        assert f.read() == render(), "regenerate with: python -m verlx.config.reference > docs/config.md"
