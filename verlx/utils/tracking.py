"""Metric loggers selected by `trainer.logger` (PPO and SFT): console, file (JSONL), tensorboard, wandb, mlflow."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import re
import sys
from typing import Any

from verlx.utils.errors import storage_errors
from verlx.utils.registry import Registry

LOGGERS: Registry[type[MetricLogger]] = Registry("logger", "trainer.logger")

# What the console shows each step, in order: (metric keys, short label, format). The keys are a regular
# expression; a column shows the sum of the metrics it matches (failed scorings: errors + timeouts), one column
# per data source where it has a `source` group.
CONSOLE_COLUMNS = (
    (r"critic/score/mean", "score", "{:.3f}"),
    (r"val-core/(?P<source>.+)/reward/mean@\d+", "val", "{:.3f}"),
    (r"response_length/mean", "resp_len", "{:.1f}"),
    (r"actor/pg_loss", "pg_loss", "{:+.4f}"),
    (r"actor/entropy", "entropy", "{:.3f}"),
    (r"actor/ppo_kl", "ppo_kl", "{:+.4f}"),
    (r"actor/kl_loss", "kl_loss", "{:.4f}"),
    (r"critic/vf_loss", "vf_loss", "{:.4f}"),
    (r"reward/(errors|timeouts)", "rew_fail", "{:.0f}"),
    (r"val-aux/(?P<source>.+)/reward/(errors|timeouts)", "val_fail", "{:.0f}"),
    (r"timing_s/gen", "gen_s", "{:.1f}"),
    (r"timing_s/step", "step_s", "{:.1f}"),
    # SFT
    (r"train/loss", "loss", "{:.4f}"),
    (r"train/lr", "lr", "{:.2e}"),
    (r"train/grad_norm", "grad_norm", "{:.3f}"),
    (r"perf/tokens_per_s", "tok/s", "{:,.0f}"),
    (r"val/accuracy", "val_acc", "{:.3f}"),
    (r"val/num_samples", "val_n", "{:.0f}"),
    (r"perf/cpu_threads", "threads", "{:.0f}"),
    (r"timing_s/elapsed", "t", "{:.0f}s"),
)
_CONSOLE_PATTERNS = [(re.compile(pattern), label, fmt) for pattern, label, fmt in CONSOLE_COLUMNS]


class MetricLogger:
    requires: str | None = None
    install: str = ""

    def __init__(self, project: str, experiment: str, config: dict, output_dir: str):
        self.project, self.experiment, self.config, self.output_dir = project, experiment, config, output_dir

    @classmethod
    def check_available(cls) -> None:
        if cls.requires and importlib.util.find_spec(cls.requires) is None:
            raise RuntimeError(f"trainer.logger includes a logger that needs '{cls.requires}', which is not "
                               f"installed: {cls.install}")

    def log(self, metrics: dict[str, float], step: int) -> None:
        raise NotImplementedError

    def finish(self) -> None:
        pass


def console_columns(metrics: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, formatted value) of every CONSOLE_COLUMNS entry that matches some metric, in table order."""
    columns, keys = [], sorted(metrics)
    for pattern, label, fmt in _CONSOLE_PATTERNS:
        sums: dict[str, Any] = {}
        for key in keys:
            match = pattern.fullmatch(key)
            if match:
                name = f"{label}:{match['source']}" if "source" in pattern.groupindex else label
                sums[name] = metrics[key] if name not in sums else sums[name] + metrics[key]
        columns += [(name, _format(value, fmt)) for name, value in sums.items()]
    return columns


def _format(value: Any, fmt: str) -> str:
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


@LOGGERS.register("console")
class ConsoleLogger(MetricLogger):
    """One compact line per step (a header every 20 lines); printed through tqdm so a progress bar stays intact."""

    def __init__(self, *args):
        super().__init__(*args)
        self.lines = 0
        self.header: list[str] = []

    def log(self, metrics, step):
        columns = console_columns(metrics)
        if not columns:
            return
        widths = [max(len(label), len(value), 7) for label, value in columns]
        write = _tqdm_write()
        labels = [label for label, _ in columns]
        if self.lines % 20 == 0 or labels != self.header:
            self.header, self.lines = labels, 0
            write("step  " + "  ".join(label.rjust(w) for (label, _), w in zip(columns, widths)))
        write(f"{step:<4}  " + "  ".join(value.rjust(w) for (_, value), w in zip(columns, widths)))
        self.lines += 1


def _tqdm_write():
    try:
        from tqdm import tqdm

        return lambda line: tqdm.write(line, file=sys.stdout)
    except ImportError:
        return print


@LOGGERS.register("file")
class JsonlLogger(MetricLogger):
    """output_dir/metrics.jsonl: one JSON object per step, flushed at once (a crash loses nothing logged)."""

    def __init__(self, *args):
        super().__init__(*args)
        os.makedirs(self.output_dir, exist_ok=True)
        self.path = os.path.join(self.output_dir, "metrics.jsonl")
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    def log(self, metrics, step):
        row = {"step": step}
        row.update({k: (v if not isinstance(v, float) or math.isfinite(v) else str(v)) for k, v in metrics.items()})
        with storage_errors("the metrics", self.path, "Free space, or set trainer.output_dir elsewhere"):
            self._file.write(json.dumps(row, default=float) + "\n")
            self._file.flush()

    def finish(self):
        with contextlib.suppress(OSError):  # a failed write was raised by log(), which flushes every row
            self._file.close()


@LOGGERS.register("tensorboard")
class TensorboardLogger(MetricLogger):
    requires = "tensorboard"
    install = "pip install tensorboard"

    def __init__(self, *args):
        super().__init__(*args)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(os.path.join(self.output_dir, "tensorboard"))

    def log(self, metrics, step):
        for k, v in metrics.items():
            if isinstance(v, (int, float)):
                self.writer.add_scalar(k, v, step)

    def finish(self):
        self.writer.close()


@LOGGERS.register("wandb")
class WandbLogger(MetricLogger):
    requires = "wandb"
    install = "pip install 'verlx[wandb]'"

    def __init__(self, *args):
        super().__init__(*args)
        import wandb

        self.run = wandb.init(project=self.project, name=self.experiment, config=self.config)

    def log(self, metrics, step):
        self.run.log(metrics, step=step)

    def finish(self):
        self.run.finish()


@LOGGERS.register("mlflow")
class MlflowLogger(MetricLogger):
    requires = "mlflow"
    install = "pip install 'verlx[mlflow]'"

    def __init__(self, *args):
        super().__init__(*args)
        import mlflow

        self.mlflow = mlflow
        mlflow.set_experiment(self.project)
        mlflow.start_run(run_name=self.experiment)

    def log(self, metrics, step):
        clean = {k.replace("@", "_at_"): v for k, v in metrics.items() if isinstance(v, (int, float))}
        self.mlflow.log_metrics(clean, step=step)

    def finish(self):
        self.mlflow.end_run()


def check_loggers(names: list[str]) -> None:
    for name in names:
        LOGGERS.get(name).check_available()


class Tracking:
    """Fans each step's metrics out to every chosen logger."""

    def __init__(self, names: list[str], project: str, experiment: str, config: dict, output_dir: str):
        check_loggers(names)
        self.loggers = [LOGGERS.get(n)(project, experiment, config, output_dir) for n in names]

    def log(self, metrics: dict[str, float], step: int) -> None:
        for logger in self.loggers:
            logger.log(metrics, step)

    def finish(self) -> None:
        for logger in self.loggers:
            logger.finish()
