"""`python -m verlx.tools.plot RUN_DIR | metrics.jsonl [--out PNG]`: a run's training curves as one PNG.

Reads the JSONL the `file` logger writes (trainer.output_dir/metrics.jsonl, one object per step) and draws one
panel per topic over steps: score, response length, KL, entropy, losses, throughput and phase timings. A panel
whose metrics the run did not log says "no data". A file still being written (or cut short) plots what it holds:
lines that are not complete JSON objects are skipped and counted. Default output: <run dir>/training_curves.png.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from verlx.utils.paths import expand_path

DEFAULT_NAME = "training_curves.png"
NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}  # how the file logger writes them
# Worker-side timings measured inside a driver phase: stacking them on top of it would count that time twice.
NESTED_TIMINGS = ("timing_s/wake_weights", "timing_s/update_weights", "timing_s/wake_kv_cache",
                  "timing_s/generate_engine", "timing_s/engine_sleep")
NESTED_TIMING_SUFFIX = "_worker"


@dataclass
class Series:
    steps: np.ndarray
    values: np.ndarray


@dataclass
class Metrics:
    """Every numeric metric of a metrics.jsonl as a series over steps (the last value wins when a step repeats)."""

    path: str
    series: dict[str, Series] = field(default_factory=dict)
    rows: int = 0
    skipped_lines: list[int] = field(default_factory=list)

    def get(self, name: str) -> Series | None:
        return self.series.get(name)

    def matching(self, prefix: str, contains: str = "") -> list[str]:
        return sorted(k for k in self.series if k.startswith(prefix) and contains in k)


def _number(value) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        return NON_FINITE.get(value.strip().lower())
    return None


def read_metrics(path: str) -> Metrics:
    """Parse the JSONL; unparsable lines (a truncated last line, a line still being written) are skipped."""
    points: dict[str, dict[float, float]] = {}
    metrics = Metrics(path)
    with open(path, encoding="utf-8", errors="replace") as f:
        for line_number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                metrics.skipped_lines.append(line_number)
                continue
            if not isinstance(row, dict):
                metrics.skipped_lines.append(line_number)
                continue
            step = _number(row.get("step"))
            step = float(metrics.rows) if step is None or not math.isfinite(step) else step
            metrics.rows += 1
            for key, value in row.items():
                number = _number(value)
                if key != "step" and number is not None:
                    points.setdefault(key, {})[step] = number
    for key, by_step in points.items():
        steps = np.array(sorted(by_step), dtype=np.float64)
        metrics.series[key] = Series(steps, np.array([by_step[s] for s in steps], dtype=np.float64))
    return metrics


# ---------------------------------------------------------------------- panels
@dataclass
class Panel:
    title: str
    draw: Callable[..., bool]  # (axes, Metrics) -> whether anything was drawn


PANELS: list[Panel] = []


def panel(title: str):
    """Register a panel; panels are laid out in the order they are registered."""

    def decorator(fn: Callable[..., bool]) -> Callable[..., bool]:
        PANELS.append(Panel(title, fn))
        return fn

    return decorator


def _lines(ax, metrics: Metrics, names: list[str], labels: list[str] | None = None, marker: str = "") -> bool:
    drawn = False
    for i, name in enumerate(names):
        s = metrics.get(name)
        if s is not None and len(s.steps):
            ax.plot(s.steps, s.values, marker or ("o" if len(s.steps) == 1 else ""), markersize=4,
                    label=labels[i] if labels else name)
            drawn = True
    return drawn


def _legend(ax, handles=None, labels=None) -> None:
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    if handles:
        ax.legend(handles, labels, loc="best", fontsize=7, ncols=2 if len(handles) > 4 else 1)


@panel("Score")
def draw_score(ax, metrics: Metrics) -> bool:
    drawn = _lines(ax, metrics, ["critic/score/mean"], ["train critic/score/mean"])
    val = metrics.matching("val-core/", "/reward/mean@")
    labels = ["val " + name.removeprefix("val-core/").replace("/reward/", " ") for name in val]
    drawn = _lines(ax, metrics, val, labels, marker="o-") or drawn
    _legend(ax)
    return drawn


@panel("Response length (tokens)")
def draw_response_length(ax, metrics: Metrics) -> bool:
    mean, low, high = (metrics.get(f"response_length/{s}") for s in ("mean", "min", "max"))
    if low is not None and high is not None:
        steps = np.intersect1d(low.steps, high.steps)
        ax.fill_between(steps, low.values[np.isin(low.steps, steps)], high.values[np.isin(high.steps, steps)],
                        alpha=0.25, label="min–max")
    drawn = _lines(ax, metrics, ["response_length/mean"], ["mean"])
    _legend(ax)
    return drawn or (low is not None and high is not None)


@panel("KL")
def draw_kl(ax, metrics: Metrics) -> bool:
    drawn = _lines(ax, metrics, ["actor/ppo_kl", "actor/kl_loss", "actor/reward_kl_penalty"])
    _legend(ax)
    return drawn


@panel("Entropy")
def draw_entropy(ax, metrics: Metrics) -> bool:
    drawn = _lines(ax, metrics, ["actor/entropy"])
    _legend(ax)
    return drawn


@panel("Losses")
def draw_losses(ax, metrics: Metrics) -> bool:
    """The value loss gets its own y axis: it is often orders of magnitude above the policy loss."""
    drawn = _lines(ax, metrics, ["actor/pg_loss"])
    if metrics.get("critic/vf_loss") is None:
        _legend(ax)
        return drawn
    value_ax = ax.twinx() if drawn else ax
    _lines(value_ax, metrics, ["critic/vf_loss"])
    value_ax.lines[-1].set_color("tab:red")
    value_ax.set_ylabel("critic/vf_loss", color="tab:red")
    if value_ax is ax:
        _legend(ax)
    else:  # one legend for both axes, on the upper one so that no line covers it
        (handles, labels), (more_handles, more_labels) = (ax.get_legend_handles_labels(),
                                                          value_ax.get_legend_handles_labels())
        _legend(value_ax, handles + more_handles, labels + more_labels)
    return True


@panel("Throughput (tokens / s / GPU)")
def draw_throughput(ax, metrics: Metrics) -> bool:
    drawn = _lines(ax, metrics, ["perf/throughput"])
    _legend(ax)
    return drawn


@panel("Phase timings (s, stacked)")
def draw_timings(ax, metrics: Metrics) -> bool:
    phases = [k for k in metrics.matching("timing_s/") if k != "timing_s/step" and k not in NESTED_TIMINGS
              and not k.endswith(NESTED_TIMING_SUFFIX)]
    phases.sort(key=lambda k: -len(metrics.series[k].steps))  # occasional phases (testing, saving) on top
    if phases:
        steps = np.unique(np.concatenate([metrics.series[k].steps for k in phases]))
        stacked = []
        for k in phases:  # a phase absent at a step (testing, checkpointing) took no time there
            s = metrics.series[k]
            column = np.zeros(len(steps))
            column[np.searchsorted(steps, s.steps)] = np.nan_to_num(s.values)
            stacked.append(column)
        ax.stackplot(steps, *stacked, labels=[k.removeprefix("timing_s/") for k in phases], alpha=0.8, step="mid")
    total = _lines(ax, metrics, ["timing_s/step"], ["step (total)"], marker="k--")
    _legend(ax)
    return bool(phases) or total


# ---------------------------------------------------------------------- the figure
def plot_metrics(metrics: Metrics, title: str | None = None, columns: int = 2):
    """A matplotlib Figure (Agg canvas) with one axes per registered panel, titled with the panel's title."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = math.ceil(len(PANELS) / columns)
    fig = Figure(figsize=(7 * columns, 3.4 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, columns, squeeze=False).ravel()
    for ax, p in zip(axes, PANELS):
        ax.set_title(p.title)
        if p.draw(ax, metrics):
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        else:
            ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, color="gray", fontsize=12)
            ax.set_xticks([])
            ax.set_yticks([])
    for ax in axes[len(PANELS):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    return fig


def _title(metrics: Metrics) -> str:
    steps = np.concatenate([s.steps for s in metrics.series.values()])
    text = f"{metrics.path} — {metrics.rows} logged rows, steps {steps.min():g} to {steps.max():g}"
    if metrics.skipped_lines:
        text += f" ({len(metrics.skipped_lines)} unreadable line(s) skipped)"
    return text


def resolve_input(target: str) -> str:
    """A run directory means its metrics.jsonl."""
    path = expand_path(target)
    return os.path.join(path, "metrics.jsonl") if os.path.isdir(path) else path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m verlx.tools.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("source", help="run directory (trainer.output_dir) or its metrics.jsonl")
    parser.add_argument("--out", help=f"PNG to write (default: {DEFAULT_NAME} next to metrics.jsonl)")
    args = parser.parse_args(argv)
    path = resolve_input(args.source)
    if not os.path.isfile(path):
        print(f"error: {path} does not exist; point at a run's trainer.output_dir (with 'file' in trainer.logger) "
              "or at its metrics.jsonl", file=sys.stderr)
        return 1
    if importlib.util.find_spec("matplotlib") is None:
        print("error: plotting needs matplotlib: pip install 'verlx[plot]' (or pip install matplotlib)",
              file=sys.stderr)
        return 1
    metrics = read_metrics(path)
    if not metrics.series:
        what = "is empty" if metrics.rows == 0 and not metrics.skipped_lines else "holds no complete metric rows"
        print(f"error: {path} {what}; nothing to plot yet (has the run logged its first step?)", file=sys.stderr)
        return 1
    out = expand_path(args.out) if args.out else os.path.join(os.path.dirname(os.path.abspath(path)),
                                                                     DEFAULT_NAME)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    plot_metrics(metrics, _title(metrics)).savefig(out, dpi=100)
    if metrics.skipped_lines:
        print(f"skipped unreadable line(s) {metrics.skipped_lines[:5]} of {path}", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
