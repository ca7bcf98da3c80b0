"""DAPO dynamic sampling (Yu et al. 2025): keep only prompts whose samples disagree.

When every sample of a prompt gets the same reward, group-relative advantages are all 0 and the prompt only
dilutes the batch. algorithm.filter_groups.metric names the per-sample value compared:
  seq_reward        sum of token_level_scores (the reward before any KL penalty)      as in veRL's DAPO trainer
  seq_final_reward  sum of token_level_rewards (after the in-reward KL penalty)       as in veRL's DAPO trainer
  score             a non_tensor_batch 'score' column if the reward function returned one, else seq_reward
  any other name    a numeric non_tensor_batch column of that name (e.g. 'acc' from the reward's extra info)
"""

from __future__ import annotations

import numpy as np
import torch

from verlx.algorithms.groups import group_ids, uniform_groups

_TENSOR_METRICS = {"seq_reward": "token_level_scores", "seq_final_reward": "token_level_rewards"}


def _metric_values(data, metric: str) -> torch.Tensor:
    if metric in _TENSOR_METRICS or (metric == "score" and "score" not in data.non_tensor_batch):
        key = _TENSOR_METRICS.get(metric, "token_level_scores")
        if key not in data.batch:
            raise KeyError(f"algorithm.filter_groups.metric={metric} needs batch key '{key}'; "
                           f"present: {sorted(data.batch)}")
        return data.batch[key].sum(dim=-1).double()
    if metric in data.non_tensor_batch:
        try:
            return torch.from_numpy(np.asarray(data.non_tensor_batch[metric], dtype=np.float64))
        except (TypeError, ValueError):
            raise ValueError(f"algorithm.filter_groups.metric={metric}: non_tensor_batch['{metric}'] is not "
                             "numeric") from None
    raise ValueError(
        f"algorithm.filter_groups.metric={metric!r} is neither built in ({', '.join(sorted(_TENSOR_METRICS))}, "
        f"score) nor a non_tensor_batch column; columns present: {sorted(data.non_tensor_batch)}"
    )


def keep_informative_groups(data, metric: str) -> np.ndarray:
    """Row indices (ascending) of the groups (rows sharing non_tensor_batch['uid']) whose metric values are not all
    equal. A group of one sample is kept, as in veRL: with n = 1 nothing could ever be kept otherwise."""
    if "uid" not in data.non_tensor_batch:
        raise KeyError("dynamic sampling needs non_tensor_batch['uid'] (one id per prompt, shared by its samples)")
    values = _metric_values(data, metric)
    ids, num_groups = group_ids(data.non_tensor_batch["uid"])
    uniform, count = uniform_groups(values, ids, num_groups)
    keep_group = ~uniform | (count == 1)
    return torch.nonzero(keep_group[ids]).reshape(-1).numpy()
