"""The console logger's one line per step: which metrics become columns, and failed reward scorings in them."""

from __future__ import annotations

from verlx.utils.tracking import ConsoleLogger


def shown(capsys, tmp_path, metrics: dict, step: int = 1) -> dict[str, str]:
    capsys.readouterr()
    ConsoleLogger("p", "e", {}, str(tmp_path)).log(metrics, step)
    header, values = capsys.readouterr().out.splitlines()
    assert header.split()[0] == "step" and values.split()[0] == str(step)
    return dict(zip(header.split()[1:], values.split()[1:]))


def test_reward_failures_column_counts_errors_and_timeouts(capsys, tmp_path):
    metrics = {"critic/score/mean": 0.5, "reward/errors": 1.0, "reward/timeouts": 2.0, "reward/error_rate": 0.1,
               "timing_s/step": 3.25}
    assert shown(capsys, tmp_path, metrics) == {"score": "0.500", "rew_fail": "3", "step_s": "3.2"}
    only_timeouts = {"reward/errors": 0.0, "reward/timeouts": 4.0}
    assert shown(capsys, tmp_path, only_timeouts) == {"rew_fail": "4"}


def test_validation_columns_per_data_source(capsys, tmp_path):
    """Data sources may contain slashes (openai/gsm8k); best@n and error_rate stay off the line."""
    metrics = {"val-core/openai/gsm8k/reward/mean@4": 0.75, "val-core/a/reward/mean@4": 0.5,
               "val-aux/a/reward/best@4/mean": 1.0, "val-aux/a/reward/errors": 0.0, "val-aux/a/reward/timeouts": 0.0,
               "val-aux/openai/gsm8k/reward/errors": 2.0, "val-aux/openai/gsm8k/reward/timeouts": 1.0,
               "val-aux/openai/gsm8k/reward/error_rate": 0.1}
    assert shown(capsys, tmp_path, metrics) == {"val:a": "0.500", "val:openai/gsm8k": "0.750", "val_fail:a": "0",
                                                "val_fail:openai/gsm8k": "3"}
