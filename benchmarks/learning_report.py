"""Held-out accuracy of the learning runs side by side: a table per configuration (seeds pooled) and two pictures.

Reads the summaries benchmarks/learning_gpu.py (verlx) and benchmarks/peer_verl.py --learning (veRL) write
(<out>/runs/<name>/summary.json, or the copies in $OUT/learning/*.json). Runs that differ only in the seed form one
configuration: its start, end and gain are the seeds' mean and their spread (max − min). The target accuracy is
veRL's final accuracy (mean over its seeds) unless --target is given; "s to target" is each run's training seconds
(benchmarks/learning_gpu.py: wall-clock less validation) at its first validation at or above it.

  python benchmarks/learning_report.py runs/learning/*.json --out docs/images --prefix learning
      → docs/images/learning_vs_step.png and learning_vs_time.png
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections import defaultdict

CONFIG_KEYS = ("system", "engine", "layout", "mode")
BASELINE = "verlx native 1gpu"  # the configuration the others' training seconds are divided by


def load_summaries(inputs: list[str]) -> list[dict]:
    files = []
    for item in inputs:
        if os.path.isdir(item):
            files += sorted(glob.glob(os.path.join(item, "*", "summary.json")))
            files += sorted(glob.glob(os.path.join(item, "*.json")))
        else:
            files.append(item)
    summaries = []
    for path in files:
        with open(path) as f:
            summary = json.load(f)
        if "curve" in summary:  # skips sft.json and other files beside them
            summaries.append(summary)
    if not summaries:
        raise SystemExit(f"no learning summaries (JSON with a 'curve') in {inputs}")
    return summaries


def config_of(summary: dict) -> tuple:
    return tuple(summary.get(key) for key in CONFIG_KEYS)


def label_of(config: tuple) -> str:
    system, engine, layout, mode = config
    return f"{system} {engine} {layout}" + ("" if mode == "sync" else f" {mode}")


def time_to_reach(summary: dict, target: float) -> float | None:
    """Training seconds at the run's first validation with accuracy ≥ target (None: never reached)."""
    return next((point["elapsed_s"] for point in summary["curve"] if point["accuracy"] >= target), None)


def verl_target(summaries: list[dict]) -> float | None:
    finals = [s["end_accuracy"] for s in summaries if s.get("system") == "verl" and s.get("end_accuracy") is not None]
    return sum(finals) / len(finals) if finals else None


def _stats(values: list) -> tuple[float | None, float | None]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return sum(values) / len(values), max(values) - min(values)


def table(summaries: list[dict], target: float | None) -> list[dict]:
    """One row per configuration: seeds, mean and spread of start/end/gain, mean s/step and training s, and the
    seconds to reach `target` (mean over the seeds that reached it, with how many did)."""
    groups = defaultdict(list)
    for summary in summaries:
        groups[config_of(summary)].append(summary)
    rows = []
    for config, runs in groups.items():
        row = {"config": label_of(config), "seeds": sorted(r.get("seed") for r in runs)}
        for key in ("start_accuracy", "end_accuracy", "gain"):
            row[key], row[f"{key}_spread"] = _stats([r.get(key) for r in runs])
        row["mean_step_s"], _ = _stats([r.get("mean_step_s") for r in runs])
        row["train_s"], _ = _stats([r.get("train_s") for r in runs])
        reached = [time_to_reach(r, target) for r in runs] if target is not None else []
        row["s_to_target"], _ = _stats(reached)
        row["reached"] = sum(t is not None for t in reached)
        rows.append(row)
    base = next((r["train_s"] for r in rows if r["config"] == BASELINE), None)
    for row in rows:
        row["train_s_vs_baseline"] = row["train_s"] / base if base and row["train_s"] is not None else None
    return rows


def print_table(rows: list[dict], target: float | None) -> None:
    def pct(value, spread=None):
        if value is None:
            return "-"
        return f"{100 * value:.1f}" + ("" if spread is None else f" ± {100 * spread / 2:.1f}")

    goal = "-" if target is None else f"{100 * target:.1f}%"
    print(f"\n| configuration | seeds | start % | end % | gain (points) | s/step | training s | vs {BASELINE} | "
          f"s to {goal} |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        to_target = "-" if r["s_to_target"] is None else f"{r['s_to_target']:.0f} ({r['reached']}/{len(r['seeds'])})"
        step_s = "-" if r["mean_step_s"] is None else f"{r['mean_step_s']:.2f}"
        train_s = "-" if r["train_s"] is None else f"{r['train_s']:.0f}"
        ratio = "-" if r["train_s_vs_baseline"] is None else f"{r['train_s_vs_baseline']:.2f}×"
        print(f"| {r['config']} | {','.join(map(str, r['seeds']))} | {pct(r['start_accuracy'])} | "
              f"{pct(r['end_accuracy'], r['end_accuracy_spread'])} | {pct(r['gain'], r['gain_spread'])} | "
              f"{step_s} | {train_s} | {ratio} | {to_target} |")
    print("(± is half the spread between seeds; training s: wall-clock less validation, start-up excluded)")


def draw(summaries: list[dict], out_dir: str, prefix: str) -> list[str]:
    """Accuracy vs step and vs training seconds, one colour per configuration, one line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = sorted({config_of(s) for s in summaries}, key=label_of)
    colours = {c: plt.get_cmap("tab10")(i % 10) for i, c in enumerate(configs)}
    os.makedirs(out_dir, exist_ok=True)
    written = []
    for axis, key, xlabel in (("step", "step", "GRPO step"), ("time", "elapsed_s", "training seconds (wall-clock "
                                                                                    "less validation)")):
        fig, ax = plt.subplots(figsize=(7, 4.2))
        labelled = set()
        for s in sorted(summaries, key=lambda s: (label_of(config_of(s)), s.get("seed") or 0)):
            config = config_of(s)
            label = None if config in labelled else label_of(config)
            labelled.add(config)
            xs = [point[key] for point in s["curve"]]
            ys = [100 * point["accuracy"] for point in s["curve"]]
            ax.plot(xs, ys, marker="o", markersize=3, color=colours[config], label=label, alpha=0.85)
        ax.set_xlabel(xlabel)
        ax.set_ylabel("held-out greedy accuracy (%)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = os.path.join(out_dir, f"{prefix}_vs_{axis}.png")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def usable(summaries: list[dict]) -> list[dict]:
    """The runs that ended well or are cut short (rc None: killed with the call; or stopped by their own
    --timeout-s, whatever rc the trainer's exit under SIGTERM gave): their curve so far. A failed run is named and
    left out."""
    kept = []
    for s in summaries:
        last = s["curve"][-1]["step"] if s["curve"] else None
        cut_short = s.get("rc") is None or s.get("stopped_at_limit", False)
        if s.get("rc") != 0 and not cut_short:
            print(f"left out: {s['name']} failed (rc {s['rc']}) after validating at step {last}")
            continue
        if cut_short:
            print(f"{s['name']}: cut short, its curve ends at step {last}")
        kept.append(s)
    return kept


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("inputs", nargs="+", help="summary JSON files, or directories holding them")
    p.add_argument("--target", type=float, help="accuracy to time (default: veRL's final accuracy)")
    p.add_argument("--out", help="directory for the pictures (none drawn without it)")
    p.add_argument("--prefix", default="learning")
    args = p.parse_args(argv)
    summaries = usable(load_summaries(args.inputs))
    target = args.target if args.target is not None else verl_target(summaries)
    print_table(table(summaries, target), target)
    if args.out:
        for path in draw(summaries, args.out, args.prefix):
            print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
