"""`python -m verlx.trainer.main_eval data.path=GENERATIONS.parquet ...`: score every response, report pass@k.

The generations file has one row per prompt and a list of n responses per row (main_generation writes one). Every
response is scored by the reward function of its row's data source (built-in, or custom_reward_function) in the
isolated scoring pool of verlx.reward; the report gives, per data source, pass@k for k = 1, 2, 4, ..., n (unbiased
estimator; a response is correct when its score >= metrics.pass_threshold) and mean@n, the mean score of all
responses. It is printed as a table and written as JSON.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections import defaultdict
from dataclasses import dataclass

import numpy as np

from verlx.config.evaluation import EvaluationConfig
from verlx.config.loader import ConfigError, DataError
from verlx.trainer.entrypoint import hydra_command
from verlx.utils.paths import expand_path

logger = logging.getLogger("verlx")


@dataclass
class Generations:
    """The rows of a generations file that matter for scoring (one entry per row)."""

    path: str
    responses: list[list[str]]
    data_sources: list[str]
    ground_truths: list
    extra_infos: list


def default_output_path(data_path: str) -> str:
    stem = expand_path(data_path, absolute=True).removesuffix(".parquet")
    return f"{stem}.eval.json"


def load_generations(config: EvaluationConfig) -> Generations:
    """Read and check the file: the columns exist, every row has a list of strings, n is constant per source."""
    from verlx.data.parquet import read_parquet_table

    d = config.data
    path = expand_path(d.path, absolute=True)
    if not os.path.isfile(path):
        raise DataError(f"data.path: file {d.path!r} does not exist (write one with main_generation)")
    table = read_parquet_table(path)
    columns = table.column_names
    for key, name in (("data.response_key", d.response_key), ("data.data_source_key", d.data_source_key)):
        if name not in columns:
            raise DataError(f"{path} has no column '{name}' ({key}); its columns are {sorted(columns)}")
    if d.reward_model_key not in columns and not config.custom_reward_function.path:
        raise DataError(
            f"{path} has no column '{d.reward_model_key}' (data.reward_model_key) with the ground truths the built-in "
            f"scores need; its columns are {sorted(columns)}. Name the right column or use custom_reward_function.path"
        )
    rows = table.num_rows
    responses = table.column(d.response_key).to_pylist()
    sources = [str(s) for s in table.column(d.data_source_key).to_pylist()]
    reward_models = table.column(d.reward_model_key).to_pylist() if d.reward_model_key in columns else [None] * rows
    extras = table.column(d.extra_info_key).to_pylist() if d.extra_info_key in columns else [None] * rows
    first_row_of: dict[str, int] = {}
    for row, (values, source) in enumerate(zip(responses, sources)):
        if not isinstance(values, list) or not values or not all(isinstance(v, str) for v in values):
            raise ValueError(
                f"{path} row {row}: column '{d.response_key}' must hold a non-empty list of response strings, "
                f"got {str(values)[:200]}"
            )
        first = first_row_of.setdefault(source, row)
        if len(values) != len(responses[first]):
            raise ValueError(
                f"{path} row {row}: {len(values)} responses, but row {first} of the same data source {source!r} has "
                f"{len(responses[first])}; pass@k needs the same number of samples for every prompt of a source"
            )
    ground_truths = [rm.get("ground_truth") if isinstance(rm, dict) else None for rm in reward_models]
    return Generations(path, responses, sources, ground_truths, extras)


def score_all(generations: Generations, config: EvaluationConfig):
    """Every response's outcome (score, status, error), row by row, in file order, from verlx.reward's manager:
    scored in its isolated pool, failures logged and counted, too many of them refused (RewardFailure)."""
    from verlx.reward.loading import load_reward_function
    from verlx.reward.managers import NaiveRewardManager

    calls = [
        dict(data_source=source, solution_str=text, ground_truth=truth,
             extra_info=dict(info) if isinstance(info, dict) else info)
        for texts, source, truth, info in zip(generations.responses, generations.data_sources,
                                              generations.ground_truths, generations.extra_infos)
        for text in texts
    ]
    fn = load_reward_function(config.custom_reward_function)
    with NaiveRewardManager(None, fn, config=config.reward, purpose="report") as manager:
        scored, _ = manager.score_calls(calls)
    return calls, scored


def build_report(generations: Generations, scored: list, pass_threshold: float) -> dict[str, dict]:
    """Per data source (sorted): prompts, n, pass@k..., mean@n, errors, timeouts."""
    from verlx.trainer.eval_metrics import summarise_source

    per_source: dict[str, list[int]] = defaultdict(list)
    for row, source in enumerate(generations.data_sources):
        per_source[source].append(row)
    starts = np.cumsum([0] + [len(r) for r in generations.responses])
    scores = np.array([s.score for s in scored], dtype=np.float64)
    failed = np.array([s.status != "ok" for s in scored])
    timeouts = np.array([s.status == "timeout" for s in scored])
    report = {}
    for source in sorted(per_source):
        rows = per_source[source]
        idx = np.concatenate([np.arange(starts[r], starts[r + 1]) for r in rows])
        entry = summarise_source(scores[idx].reshape(len(rows), -1), pass_threshold)
        entry["errors"] = int(failed[idx].sum() - timeouts[idx].sum())
        entry["timeouts"] = int(timeouts[idx].sum())
        report[source] = entry
    return report


def format_table(report: dict[str, dict]) -> str:
    """One row per data source; columns are the union of the sources' metrics ('-' where a source has none)."""
    columns = ["data_source"] + list(dict.fromkeys(k for entry in report.values() for k in entry))
    rows = [[source] + [_cell(entry.get(k)) for k in columns[1:]] for source, entry in report.items()]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(columns, widths)))]
    lines += ["  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))) for r in rows]
    return "\n".join(lines)


def _cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_json(path: str, payload: dict) -> None:
    """Written under a temporary name and renamed, so a reader never sees half a file."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(payload, f, indent=2, ensure_ascii=False)
        f.write("\n")
    os.replace(tmp, path)


def run_eval(config: EvaluationConfig) -> dict:
    """Score, report, print and write; returns the JSON payload."""
    if not math.isfinite(config.metrics.pass_threshold):
        raise ConfigError([f"metrics.pass_threshold={config.metrics.pass_threshold} must be a finite number"])
    generations = load_generations(config)
    _, scored = score_all(generations, config)
    report = build_report(generations, scored, config.metrics.pass_threshold)
    payload = {"data_path": generations.path, "pass_threshold": config.metrics.pass_threshold,
               "rows": len(generations.responses), "samples": len(scored), "data_sources": report}
    output = (expand_path(config.output_path, absolute=True) if config.output_path
              else default_output_path(generations.path))
    write_json(output, payload)
    print(format_table(report))
    print(f"wrote {output}")
    return payload


main = hydra_command("evaluation", EvaluationConfig, run_eval,
                     stopped="; nothing was written (the report is written once every response is scored)")

if __name__ == "__main__":
    main()
