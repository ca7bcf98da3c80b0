"""Offline evaluation metrics from n scored samples per prompt: unbiased pass@k and the mean score, per data source."""

from __future__ import annotations

import numpy as np


def pass_at_k(n: np.ndarray | int, c: np.ndarray | int, k: int) -> np.ndarray:
    """Unbiased estimate of the chance that at least one of k samples is correct, given c correct of n drawn
    (Chen et al., 2021): 1 - C(n-c, k) / C(n, k), per prompt.

    Computed as 1 - prod_{i=n-c+1}^{n} (1 - k/i), which needs no large binomials; when n - c < k the product has
    the factor i = k, which is 0, so the estimate is exactly 1.
    """
    n = np.atleast_1d(np.asarray(n, dtype=np.int64))
    c = np.atleast_1d(np.asarray(c, dtype=np.int64))
    n, c = np.broadcast_arrays(n, c)
    if k < 1:
        raise ValueError(f"pass@k needs k >= 1, got {k}")
    if (n < k).any():
        raise ValueError(f"pass@{k} needs at least {k} samples per prompt; some prompts have {int(n.min())}")
    if ((c < 0) | (c > n)).any():
        raise ValueError("pass@k: the correct count c must lie within [0, n] for every prompt")
    i = np.arange(1, int(n.max()) + 1, dtype=np.float64)
    in_product = (i[None, :] > (n - c)[:, None]) & (i[None, :] <= n[:, None])
    return 1.0 - np.where(in_product, 1.0 - k / i[None, :], 1.0).prod(axis=1)


def pass_ks(n: int) -> list[int]:
    """The k reported for n samples per prompt: 1, the powers of 2 below n, and n itself."""
    if n < 1:
        raise ValueError(f"need at least one sample per prompt, got n={n}")
    ks = [1 << p for p in range(n.bit_length()) if 1 << p <= n]
    return ks if ks[-1] == n else ks + [n]


def summarise_source(scores: np.ndarray, pass_threshold: float) -> dict[str, float]:
    """scores [prompts, n] of one data source → pass@k for every k of pass_ks(n), and mean@n (all samples)."""
    if scores.ndim != 2 or scores.shape[0] == 0 or scores.shape[1] == 0:
        raise ValueError(f"expected scores of shape [prompts, n] with both > 0, got {scores.shape}")
    prompts, n = scores.shape
    correct = (scores >= pass_threshold).sum(axis=1)
    report: dict[str, float] = {"prompts": prompts, "n": n}
    for k in pass_ks(n):
        report[f"pass@{k}"] = float(pass_at_k(n, correct, k).mean())
    report[f"mean@{n}"] = float(scores.mean())
    return report
