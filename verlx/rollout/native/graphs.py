"""Runs decode steps: replayed CUDA graphs on a GPU, the same Python step eagerly on CPU or when asked.

A graph is captured lazily per (batch bucket, KV length bucket, sampling plan) the first time a generate call
needs it, into one memory pool shared by all graphs (they never run concurrently). Capturing does not run the
step, so the eager warm-up that must precede a capture is used as the first real step of the round.
Graphs bake in buffer addresses, so `reset()` drops them whenever the KV cache or weights are re-allocated.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

import torch

logger = logging.getLogger(__name__)


def batch_buckets(max_batch: int) -> list[int]:
    """1, 2, 4, 8, then steps of at most 1.5x (12, 16, 24, 32, 48, ...), always ending at max_batch."""
    buckets, b = [], 1
    while b < max_batch:
        buckets.append(b)
        b = b * 2 if b < 8 else b + b // 2 if (b & (b - 1)) == 0 else (b // 3) * 4
    buckets.append(max_batch)
    return buckets


def round_kv_len(needed: int, block: int, max_len: int) -> int:
    """Round a KV length up to a bucket: multiples of `block`, coarser (1/8 of the length) for long ones."""
    granule = block
    while granule * 8 < needed:
        granule *= 2
    return min(max_len, -(-needed // granule) * granule)


class DecodeRunner:
    """`run(key, steps)` executes `step(*key)` `steps` times, from a CUDA graph when enabled."""

    def __init__(self, step: Callable[..., None], device: torch.device, use_graphs: bool):
        self.step = step
        self.device = device
        self.use_graphs = use_graphs and device.type == "cuda"
        self.graphs: dict[Hashable, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self._stream: torch.cuda.Stream | None = None
        self.captures = 0

    def reset(self) -> None:
        self.graphs.clear()
        self._pool = None

    def run(self, key: tuple, steps: int) -> None:
        if steps <= 0:
            return
        if not self.use_graphs:
            for _ in range(steps):
                self.step(*key)
            return
        graph = self.graphs.get(key)
        if graph is None:
            graph = self._capture(key)
            steps -= 1  # the warm-up before the capture was a real step
            if graph is None:
                for _ in range(steps):
                    self.step(*key)
                return
        for _ in range(steps):
            graph.replay()

    def _capture(self, key: tuple):
        if self._stream is None:
            self._stream = torch.cuda.Stream(self.device)
        stream = self._stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self.step(*key)  # warm-up = the round's first step
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(stream):
                graph.capture_begin(pool=self._pool)
                try:
                    self.step(*key)
                finally:
                    graph.capture_end()
        except RuntimeError as err:  # an op that cannot be captured: keep generating, eagerly
            logger.warning("native engine: CUDA graph capture failed (%s); decoding eagerly from now on", err)
            self.use_graphs = False
            self.reset()
            return None
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self.graphs[key] = graph
        self.captures += 1
        return graph
