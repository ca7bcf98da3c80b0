"""Where the SFT trainer's metrics go: a compact console line and/or a JSONL file (registry `trainer.logger`)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from typing import Protocol

from verlx.utils.registry import Registry


class MetricSink(Protocol):
    def write(self, step: int, metrics: dict[str, float]) -> None: ...

    def close(self) -> None: ...


METRIC_SINKS: Registry[Callable[[str], MetricSink]] = Registry("metric sink", config_key="trainer.logger")

# Console names: the metric key → (short label, format).
_CONSOLE_FORMATS = {
    "train/loss": ("loss", "{:.4f}"),
    "train/lr": ("lr", "{:.2e}"),
    "train/grad_norm": ("grad_norm", "{:.3f}"),
    "perf/tokens_per_s": ("tok/s", "{:,.0f}"),
    "val/accuracy": ("val_acc", "{:.3f}"),
    "val/num_samples": ("val_n", "{:.0f}"),
    "perf/cpu_threads": ("threads", "{:.0f}"),
    "timing_s/elapsed": ("t", "{:.0f}s"),
}


@METRIC_SINKS.register("console")
class ConsoleSink:
    """One line per logging step with the metrics that matter, in a fixed order."""

    def __init__(self, output_dir: str):
        self.stream = sys.stdout

    def write(self, step: int, metrics: dict[str, float]) -> None:
        parts = [f"step {step}"]
        for key, (label, fmt) in _CONSOLE_FORMATS.items():
            if key in metrics:
                parts.append(f"{label} {fmt.format(metrics[key])}")
        print(" | ".join(parts), file=self.stream, flush=True)

    def close(self) -> None:
        pass


@METRIC_SINKS.register("file")
class JsonlSink:
    """`<trainer.output_dir>/metrics.jsonl`: one JSON object per logging step (all metrics, with `step`)."""

    def __init__(self, output_dir: str):
        os.makedirs(output_dir, exist_ok=True)
        self.path = os.path.join(output_dir, "metrics.jsonl")
        self.file = open(self.path, "w")

    def write(self, step: int, metrics: dict[str, float]) -> None:
        self.file.write(json.dumps({"step": step, **metrics}) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


class MetricsLogger:
    """Fans metrics out to the configured sinks; only the writing rank builds sinks."""

    def __init__(self, names: list[str], output_dir: str, enabled: bool):
        self.sinks = [METRIC_SINKS.get(name)(output_dir) for name in names] if enabled else []

    def log(self, step: int, metrics: dict[str, float]) -> None:
        for sink in self.sinks:
            sink.write(step, metrics)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
