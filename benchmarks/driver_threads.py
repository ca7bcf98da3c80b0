"""The trainer driver's per-step tensor work (balance_batch, compute_advantage, compute_data_metrics, token_counts)
on a 512-sample batch of the multi-turn layout (256 + 336 columns), at several intra-op thread counts.

On an idle host the thread count hardly matters; on a host whose cores another job keeps busy, every parallel op
waits for descheduled OpenMP threads. Run it once alone and once beside a CPU-heavy job to see both.

  python benchmarks/driver_threads.py --threads 1,2,4,16
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))


def step_batch(rows: int):
    from helpers.ppo_batches import ragged_ppo_batch

    data = ragged_ppo_batch(0, rows=rows, prompt=256, response=336, token_range=(3, 1000))
    data.batch["token_level_scores"] = torch.zeros_like(data.batch["advantages"])
    data.batch["token_level_rewards"] = data.batch["token_level_scores"]
    data.batch["prompts"] = data.batch["input_ids"][:, :256]
    data.non_tensor_batch["uid"] = np.array([str(i // 8) for i in range(rows)], dtype=object)
    return data


def driver_work_seconds(rows: int, repeats: int) -> list[float]:
    from verlx.algorithms.advantages import compute_advantage
    from verlx.config.schema import AlgorithmConfig
    from verlx.metrics.data import compute_data_metrics
    from verlx.metrics.throughput import token_counts
    from verlx.utils.seqlen_balancing import balance_batch

    cfg = AlgorithmConfig(adv_estimator="grpo")
    times = []
    for _ in range(repeats):
        data = step_batch(rows)
        start = time.perf_counter()
        balance_batch(data, 1)
        compute_advantage(data, cfg)
        compute_data_metrics(data, False)
        token_counts(data)
        times.append(time.perf_counter() - start)
    return times


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", default="1,2")
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--repeats", type=int, default=12)
    args = p.parse_args(argv)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        times = driver_work_seconds(args.rows, args.repeats)[2:]  # the first two warm the allocator
        print(f"{threads} thread(s): median {1e3 * statistics.median(times):.1f} ms, "
              f"max {1e3 * max(times):.1f} ms over {len(times)} repeats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
