"""A reward that gives the policy nothing to learn from, caught within a few steps instead of trained on silently.

When every sample of a prompt group gets the same score, the group's relative advantages are all 0 (GRPO, RLOO,
...): the step costs its compute and the policy does not move. A reward function that returns one constant, a
ground truth the function never matches, or a task the model always (or never) solves all look like this.
Every step logs critic/score/zero_variance_ratio, the share of prompt groups whose samples all scored the same;
a data source whose groups have all been uniform for `patience` consecutive steps gets one warning that names its
reward function. With one sample per prompt (rollout.n=1) each data source's whole batch counts as one group.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from verlx.algorithms.groups import group_ids, uniform_groups

logger = logging.getLogger(__name__)
ZERO_SIGNAL_PATIENCE = 3  # consecutive steps without any signal before the warning: one unlucky batch is not a bug


class RewardSignalMonitor:
    """`describe(data_source)` names the reward function that scores a data source (for the warning)."""

    def __init__(self, describe: Callable[[str], str], reward_fn_key: str, patience: int = ZERO_SIGNAL_PATIENCE):
        self.describe = describe
        self.reward_fn_key = reward_fn_key
        self.patience = patience
        self.streaks: dict[str, int] = {}

    def observe(self, batch, step: int) -> dict[str, float]:
        """critic/score/zero_variance_ratio of a scored batch (uid per prompt group); warns as described above."""
        scores = batch.batch["token_level_scores"].sum(-1)
        sources = np.asarray(batch.non_tensor_batch.get(self.reward_fn_key, ["unknown"] * len(scores)), dtype=object)
        ids, num_groups = group_ids(batch.non_tensor_batch["uid"])
        uniform, count = uniform_groups(scores, ids, num_groups)
        if bool((count < 2).all()):  # one sample per prompt: nothing to compare within a group
            ids, num_groups = group_ids(sources)
            uniform, count = uniform_groups(scores, ids, num_groups)
        group_source = np.empty(num_groups, dtype=object)
        group_source[ids.numpy()] = sources
        uniform_np = uniform.numpy()
        for source in sorted(set(group_source.tolist())):
            mine = group_source == source
            if uniform_np[mine].all():
                self.streaks[source] = self.streaks.get(source, 0) + 1
                if self.streaks[source] == self.patience:
                    self._warn(source, step, scores[torch.from_numpy(sources == source)], int(count[mine].max()))
            else:
                self.streaks[source] = 0
        return {"critic/score/zero_variance_ratio": float(uniform_np.mean())}

    def _warn(self, source: str, step: int, scores: torch.Tensor, group_size: int) -> None:
        values = torch.unique(scores).tolist()
        what = (f"every sample scored {values[0]:g}" if len(values) == 1
                else f"scores differ only between prompts ({len(values)} distinct values)")
        logger.warning(
            "step %d: for %d steps in a row every prompt group of data_source %r scored the same on all its %d "
            "samples (%s; critic/score/zero_variance_ratio of that source 1.00), so the group-relative advantages "
            "are 0 and the policy learns nothing from it. Reward: %s. Check that it tells responses apart (a "
            "constant return, or a ground_truth it never matches); if the task is too hard or too easy for the "
            "model, change the data or warm-start the model, or keep only informative groups with "
            "algorithm.filter_groups.enable=true.",
            step, self.patience, source, group_size, what, self.describe(source),
        )
