"""Allocator settings between training and generation."""

from __future__ import annotations

import pytest
import torch

from verlx.utils.environ import scoped_environ
from verlx.utils.memory import alloc_conf_without_expandable_segments, set_expandable_segments


@pytest.mark.parametrize(
    "conf,expected",
    [
        ("expandable_segments:True", None),
        ("expandable_segments:True,max_split_size_mb:128", "max_split_size_mb:128"),
        ("max_split_size_mb:128, expandable_segments:False,garbage_collection_threshold:0.6",
         "max_split_size_mb:128,garbage_collection_threshold:0.6"),
        ("max_split_size_mb:128", "max_split_size_mb:128"),
        ("", ""),
        (None, None),
    ],
)
def test_alloc_conf_without_expandable_segments(conf, expected):
    assert alloc_conf_without_expandable_segments(conf) == expected


def test_set_expandable_segments_leaves_cuda_alone_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU path")
    set_expandable_segments(True)
    set_expandable_segments(False)
    assert not torch.cuda.is_initialized()


def test_scoped_environ_restores(monkeypatch):
    import os

    monkeypatch.setenv("A_VAR", "1")
    monkeypatch.delenv("B_VAR", raising=False)
    monkeypatch.setenv("WRITTEN_INSIDE", "keep")
    with scoped_environ({"A_VAR": None, "B_VAR": "2"}, restore=["WRITTEN_INSIDE"]):
        assert "A_VAR" not in os.environ and os.environ["B_VAR"] == "2"
        os.environ["WRITTEN_INSIDE"] = "changed"
    assert os.environ["A_VAR"] == "1" and "B_VAR" not in os.environ and os.environ["WRITTEN_INSIDE"] == "keep"
