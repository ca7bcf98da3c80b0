"""Validation: generate with val_kwargs, score, and report veRL's val-core / val-aux metrics per data source.

Failed scorings count in the mean as reward.error_score, as in training, and are reported beside it per data source
(val-aux/<source>/reward/errors, .../timeouts, .../error_rate), so a broken reward never reads as a wrong answer.
"""

from __future__ import annotations

import os
from collections import defaultdict

import numpy as np

from verlx.batch_columns import MODEL_INPUTS, non_tensor_generation_inputs
from verlx.reward.managers import RewardFailure
from verlx.rollout.agent.inputs import agent_input_keys
from verlx.trainer.generation_dump import generation_records, write_jsonl
from verlx.utils.paths import expand_path


class Validator:
    def __init__(self, config, actor_rollout_wg, reward_fn, tokenizer):
        self.config = config
        self.wg = actor_rollout_wg
        self.reward_fn = reward_fn
        self.tokenizer = tokenizer
        self.world_size = config.trainer.nnodes * config.trainer.n_gpus_per_node
        self.runs = 0

    def run(self, loader) -> dict[str, float]:
        val_kwargs = self.config.actor_rollout_ref.rollout.val_kwargs
        n = val_kwargs.n
        scores: list[np.ndarray] = []
        sources: list[np.ndarray] = []
        statuses: list[np.ndarray] = []
        extras: dict[str, list[np.ndarray]] = defaultdict(list)
        records: list[dict] = []
        for batch in loader:
            batch = batch.repeat(n, interleave=True)
            inputs = non_tensor_generation_inputs(batch.non_tensor_batch)
            keys = [*inputs, *agent_input_keys(batch, self.config.actor_rollout_ref.rollout.uses_agent_loop)]
            gen_in, pad = batch.select(list(MODEL_INPUTS), keys, []).pad_to_divisor(self.world_size)
            # rows are already repeated n times: one sample per row
            gen_in.meta_info.update({"validate": True, "n": 1, "do_sample": val_kwargs.do_sample,
                                     "seed": self.config.actor_rollout_ref.rollout.seed})
            out = self.wg.generate_sequences(gen_in).unpad(pad)
            out.meta_info.pop("timing", None)
            out.meta_info.pop("metrics", None)
            batch.pop(batch_keys=list(MODEL_INPUTS), non_tensor_batch_keys=inputs)
            batch.union(out)
            try:
                result = self.reward_fn(batch)
            except RewardFailure as e:
                raise RewardFailure(f"validation: {e}") from None
            seq_scores = result.token_level_scores.sum(-1)
            batch.non_tensor_batch["reward_status"] = np.asarray(result.extra["reward_status"], dtype=object)
            statuses.append(batch.non_tensor_batch["reward_status"])
            scores.append(seq_scores.numpy())
            names = batch.non_tensor_batch.get("data_source", ["unknown"] * len(batch))
            sources.append(np.asarray(names, dtype=object))
            for key, values in result.extra.items():
                arr = np.asarray(values)
                if arr.dtype.kind in "fiub":
                    extras[key].append(arr.astype(float))
            records += generation_records(batch, self.tokenizer, seq_scores)
        self.runs += 1
        self._show_and_dump(records)
        return summarise(np.concatenate(scores), np.concatenate(sources), n,
                         {k: np.concatenate(v) for k, v in extras.items()}, np.concatenate(statuses))

    def _show_and_dump(self, records: list[dict]) -> None:
        t = self.config.trainer
        for record in records[: t.log_val_generations]:
            failed = f" ({record['reward_status']})" if record.get("reward_status", "ok") != "ok" else ""
            print(f"[validation] {record['prompt']!r} -> {record['response']!r} score={record['score']}{failed}")
        if t.validation_data_dir:
            write_jsonl(os.path.join(expand_path(t.validation_data_dir), f"val_{self.runs}.jsonl"), records)


def summarise(scores: np.ndarray, sources: np.ndarray, n: int, extras: dict[str, np.ndarray],
              statuses: np.ndarray) -> dict[str, float]:
    """Rows come in groups of n (one prompt each). mean@n over all samples; best@n / worst@n over groups; the
    reward's sem@n, the standard error of mean@n over the prompts (so a gain smaller than about two of them cannot
    be told from the luck of the draw of the validation prompts); failed scorings (errors, timeouts: counts of
    samples; error_rate: both over the samples) with training's names."""
    metrics: dict[str, float] = {}
    series = {"reward": scores, **extras}
    for source in sorted(set(sources.tolist())):
        rows = np.nonzero(sources == source)[0]
        timeouts = int((statuses[rows] == "timeout").sum())
        failed = int((statuses[rows] != "ok").sum())
        metrics[f"val-aux/{source}/reward/errors"] = float(failed - timeouts)
        metrics[f"val-aux/{source}/reward/timeouts"] = float(timeouts)
        metrics[f"val-aux/{source}/reward/error_rate"] = failed / len(rows)
        for name, values in series.items():
            v = values[rows]
            metrics[f"val-core/{source}/{name}/mean@{n}" if name == "reward" else
                    f"val-aux/{source}/{name}/mean@{n}"] = float(v.mean())
            if name == "reward":
                per_prompt = v.reshape(-1, n).mean(1)
                spread = per_prompt.std(ddof=1) if len(per_prompt) > 1 else 0.0
                metrics[f"val-aux/{source}/reward/sem@{n}"] = float(spread / np.sqrt(len(per_prompt)))
            if n > 1:
                groups = v.reshape(-1, n)
                metrics[f"val-aux/{source}/{name}/best@{n}/mean"] = float(groups.max(1).mean())
                metrics[f"val-aux/{source}/{name}/worst@{n}/mean"] = float(groups.min(1).mean())
    return metrics
