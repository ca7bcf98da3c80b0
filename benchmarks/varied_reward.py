"""A reward that differs between the samples of one prompt, so GRPO's and GAE's advantages are not all zero with
random-weight models (whose responses often decode to nothing) and an update moves the weights: the k-th scored
sample gets (k mod 7) / 7. benchmarks/megatron_gpu.py names it as the custom reward function (with
reward.num_workers=0 the driver scores in order); it measures nothing about the task."""

from __future__ import annotations

import itertools

_ORDER = itertools.count()


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs) -> float:
    return (next(_ORDER) % 7) / 7
