"""The quick start's bookkeeping: reading its held-out accuracy, the report with standard errors, the warning for a
test split too small for its claim, and refusing to resume another seed's run."""

from __future__ import annotations

import json

import pytest

from verlx.quickstart import (
    ACCURACY_KEY,
    ERROR_KEY,
    _claim_output_dir,
    _report,
    rows_to_resolve,
    small_test_split_warning,
    val_accuracy,
)


def test_rows_needed_to_resolve_a_gain():
    # 2 * sqrt(2 * 0.25 / n) <= 0.15  <=>  n >= 2 / 0.15**2 = 88.9
    assert rows_to_resolve(0.15) == 89 and rows_to_resolve(0.10) == 200
    assert small_test_split_warning(89) is None and small_test_split_warning(500) is None
    assert small_test_split_warning(50) == (
        "--test_size 50 is too small to measure a 15% gain: two standard errors of the before/after difference "
        "can reach 20 points; use at least 89 rows")  # 200 * sqrt(0.5 / 50) = 20


def test_val_accuracy_reads_accuracy_and_its_error(tmp_path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, ACCURACY_KEY: 0.5, ERROR_KEY: 0.02}, {"step": 1, "critic/score/mean": 0.4},
            {"step": 10, ACCURACY_KEY: 0.75, ERROR_KEY: 0.01}]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"step\": 11, \"val-co")  # a line cut short
    assert val_accuracy(str(path)) == [(0, 0.5, 0.02), (10, 0.75, 0.01)]


def test_report_states_the_gain_and_whether_it_stands_out(capsys):
    _report([(0, 0.55, 0.03), (40, 0.80, 0.04)], 500, 3.5)
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["held-out accuracy (greedy, 500 unseen sums; ± one standard error):",
                       "  step   0:  55.0% ± 3.0", "  step  40:  80.0% ± 4.0",
                       "before RL 55.0% -> after RL 80.0% (+25.0 points, ± 5.0) in 3.5 min"]  # sqrt(3² + 4²) = 5
    _report([(0, 0.55, 0.03), (40, 0.60, 0.04)], 100, 3.5)
    assert capsys.readouterr().out.splitlines()[-1] == (
        "the change is within two standard errors (10.0 points) of the 100-row test set: it cannot be told from "
        "noise; use a larger --test_size")


def test_an_output_dir_is_resumed_only_with_the_same_settings(tmp_path):
    out = str(tmp_path / "qs")
    _claim_output_dir(out, {"seed": 1, "test_size": 500})
    _claim_output_dir(out, {"seed": 1, "test_size": 500})
    with pytest.raises(SystemExit, match="holds the quick start of {'seed': 1, 'test_size': 500}, whose stages would "
                                         "be reused for {'seed': 2, 'test_size': 500}; pass another --output_dir"):
        _claim_output_dir(out, {"seed": 2, "test_size": 500})
