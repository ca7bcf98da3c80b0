"""python -m verlx.tools.plot: a PNG of a hand-written metrics.jsonl (with a truncated last line), and clean exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image

from verlx.tools.plot import PANELS, main, plot_metrics, read_metrics

TITLES = ["Score", "Response length (tokens)", "KL", "Entropy", "Losses", "Throughput (tokens / s / GPU)",
          "Phase timings (s, stacked)"]


def training_row(step: int) -> dict:
    return {
        "step": step, "critic/score/mean": 0.1 * step, "response_length/mean": 10.0 + step,
        "response_length/min": 2.0, "response_length/max": 30.0 + step, "actor/ppo_kl": 0.01 * step,
        "actor/kl_loss": 0.02 * step, "actor/entropy": 2.0 - 0.1 * step, "actor/pg_loss": -0.01 * step,
        "critic/vf_loss": 1.0 / step, "timing_s/gen": 2.0, "timing_s/update_actor": 1.0, "timing_s/step": 3.5,
        "timing_s/update_actor_worker": 0.9, "training/global_step": step,
    }


def write_run(directory, rows, tail: str = "") -> str:
    path = os.path.join(directory, "metrics.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
        f.write(tail)
    return path


def lines_by_label(ax) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {line.get_label(): (np.asarray(line.get_xdata()), np.asarray(line.get_ydata())) for line in ax.lines}


def test_png_of_a_run_still_being_written(tmp_path, capsys):
    rows = [{"step": 0, "val-core/arithmetic/reward/mean@1": 0.05}]
    rows += [training_row(s) for s in (1, 2, 3, 4)]
    rows[2]["val-core/arithmetic/reward/mean@1"] = 0.25
    rows[3]["actor/entropy"] = "nan"  # how the file logger writes a non-finite value
    write_run(tmp_path, rows, tail='{"step": 5, "critic/score/mean": 0.5, "actor/ent')  # cut mid-line

    assert main([str(tmp_path)]) == 0
    out = tmp_path / "training_curves.png"
    assert capsys.readouterr().out.strip() == str(out)
    with Image.open(out) as image:
        assert image.format == "PNG"
        assert image.size == (1400, 1360)  # 2 × 7 in wide, 4 rows × 3.4 in tall, at 100 dpi
    assert out.stat().st_size > 50_000  # seven drawn panels, not a blank canvas

    metrics = read_metrics(str(tmp_path / "metrics.jsonl"))
    assert metrics.rows == 5 and metrics.skipped_lines == [6]
    fig = plot_metrics(metrics)
    titled = {ax.get_title(): ax for ax in fig.axes if ax.get_title()}
    assert list(titled) == TITLES == [p.title for p in PANELS]

    score = lines_by_label(titled["Score"])
    np.testing.assert_allclose(score["train critic/score/mean"][1], [0.1, 0.2, 0.3, 0.4])
    np.testing.assert_array_equal(score["val arithmetic mean@1"][0], [0, 2])
    np.testing.assert_allclose(score["val arithmetic mean@1"][1], [0.05, 0.25])
    assert set(lines_by_label(titled["KL"])) == {"actor/ppo_kl", "actor/kl_loss"}
    entropy = lines_by_label(titled["Entropy"])["actor/entropy"][1]
    assert np.isnan(entropy[2]) and entropy[3] == pytest.approx(1.6)
    # the value loss sits on its own (twin) y axis of the Losses panel
    twin = [ax for ax in fig.axes if not ax.get_title() and ax.get_ylabel() == "critic/vf_loss"]
    np.testing.assert_allclose(lines_by_label(twin[0])["critic/vf_loss"][1], [1.0, 0.5, 1 / 3, 0.25])
    # phases stacked: gen + update_actor = 3.0 s per step; the worker-side timing is not stacked on top again
    timings = titled["Phase timings (s, stacked)"]
    assert [t.get_text() for t in timings.get_legend().get_texts()] == ["gen", "update_actor", "step (total)"]
    assert timings.get_ylim()[1] == pytest.approx(3.5 * 1.05, rel=0.05)
    # no throughput was logged: that panel says so instead of drawing an empty frame
    assert [t.get_text() for t in titled["Throughput (tokens / s / GPU)"].texts] == ["no data"]


def test_a_repeated_step_keeps_the_last_value(tmp_path):
    """A resumed run appends to the same file and logs some steps again."""
    path = write_run(tmp_path, [training_row(1), training_row(2), {"step": 2, "critic/score/mean": 0.9}])
    series = read_metrics(path).series["critic/score/mean"]
    np.testing.assert_array_equal(series.steps, [1, 2])
    np.testing.assert_allclose(series.values, [0.1, 0.9])


def test_out_option_and_metrics_file_argument(tmp_path, capsys):
    path = write_run(tmp_path, [training_row(1)])
    target = tmp_path / "figs" / "curves.png"
    assert main([path, "--out", str(target)]) == 0
    assert capsys.readouterr().out.strip() == str(target)
    assert target.stat().st_size > 10_000


@pytest.mark.parametrize(
    "content,message",
    [("", "is empty"), ('{"step": 1, "critic/sc', "holds no complete metric rows")],
    ids=["empty", "only-a-truncated-line"],
)
def test_nothing_to_plot_exits_1_without_traceback(tmp_path, content, message):
    (tmp_path / "metrics.jsonl").write_text(content)
    result = subprocess.run([sys.executable, "-m", "verlx.tools.plot", str(tmp_path)], capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "training_curves.png").exists()


def test_missing_inputs_are_named(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere")]) == 1
    assert "nowhere does not exist" in capsys.readouterr().err
    assert main([str(tmp_path)]) == 1  # a directory without the file logger's output
    assert f"{tmp_path}/metrics.jsonl does not exist" in capsys.readouterr().err
