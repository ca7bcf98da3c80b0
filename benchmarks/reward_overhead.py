"""What reward isolation costs per step (CPU; no GPU needed).

    python benchmarks/reward_overhead.py                 # 1,024 samples, 2 scoring processes, 4 hung samples
    python benchmarks/reward_overhead.py --samples 64 --repeats 1 --hung 2 --timeout 1   # a quick smoke run

1. Fast path: a batch of GSM8K-style responses through the reward manager (decode, score with the built-in
   GSM8K score, place on the last token) with `--workers` scoring processes (reward.num_workers), warm (the
   processes already started), and the same batch scored in the driver (reward.num_workers=0) for reference.
   The difference is the isolation's cost: pickling the calls, the pipes, the bookkeeping.
2. Hung samples: `--hung` consecutive samples (one response group) that never return, in a batch of `--samples`,
   with reward.timeout_s=`--timeout`. Stuck samples wait out their timeouts side by side, so the step takes about
   one timeout; one after another it would take `--hung` timeouts.

Prints a table; writes $OUT/reward_overhead.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

HANGING_REWARD = """
import time
from verlx.reward.scores import default_compute_score

def compute_score(data_source, solution_str, ground_truth, extra_info):
    if solution_str == "hang":
        time.sleep(10**9)
    return default_compute_score(data_source, solution_str, ground_truth, extra_info)
"""


def make_batch(tokenizer, texts: list[str], truth: str = "3"):
    import torch

    from verlx.protocol import DataProto

    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    width = max(len(x) for x in ids) + 1
    responses = torch.full((len(ids), width), tokenizer.pad_token_id)
    mask = torch.zeros(len(ids), width, dtype=torch.long)
    for row, x in enumerate(ids):
        responses[row, : len(x)] = torch.tensor(x)
        mask[row, : len(x)] = 1
    non_tensor = {
        "data_source": ["openai/gsm8k"] * len(texts),
        "reward_model": [{"style": "rule", "ground_truth": truth}] * len(texts),
        "extra_info": [{"index": i} for i in range(len(texts))],
    }
    return DataProto({"responses": responses, "response_mask": mask}, non_tensor)


def time_calls(manager, batch, repeats: int) -> list[float]:
    manager(batch)  # warm: processes started, modules imported
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        manager(batch)
        times.append(time.perf_counter() - start)
    return times


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--workers", type=int, default=2, help="reward.num_workers")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--hung", type=int, default=4, help="samples that never return (0: skip this part)")
    p.add_argument("--timeout", type=float, default=5.0, help="reward.timeout_s of the hung-samples part")
    args = p.parse_args(argv)

    from verlx.config.run import CustomRewardFunctionConfig, RewardConfig
    from verlx.models.tiny import build_tokenizer
    from verlx.reward.loading import load_reward_function
    from verlx.reward.managers import NaiveRewardManager

    tokenizer = build_tokenizer()
    batch = make_batch(tokenizer, ["The answer is #### 3", "The answer is #### 4"] * (args.samples // 2))
    result = {"samples": len(batch), "workers": args.workers, "repeats": args.repeats}
    for name, workers in (("pool", args.workers), ("driver", 0)):
        with NaiveRewardManager(tokenizer, config=RewardConfig(num_workers=workers, timeout_s=30)) as manager:
            times = time_calls(manager, batch, args.repeats)
        result[f"{name}_s"] = {"median": statistics.median(times), "min": min(times), "max": max(times)}

    if args.hung > 0:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "hanging_reward.py")
            with open(path, "w") as f:
                f.write(HANGING_REWARD)
            fn = load_reward_function(CustomRewardFunctionConfig(path=path))
            half = (args.samples - args.hung) // 2
            texts = ["#### 3"] * half + ["hang"] * args.hung + ["#### 3"] * (args.samples - args.hung - half)
            config = RewardConfig(num_workers=args.workers, timeout_s=args.timeout, max_error_fraction=1.0,
                                  show_errors=0)
            with NaiveRewardManager(tokenizer, fn, config=config) as manager:
                manager(make_batch(tokenizer, ["#### 3"] * 8))  # warm
                start = time.perf_counter()
                out = manager(make_batch(tokenizer, texts))
                elapsed = time.perf_counter() - start
        result["hung"] = {"samples": args.hung, "timeout_s": args.timeout, "elapsed_s": elapsed,
                          "timeouts": out.metrics["reward/timeouts"]}

    print_table(result)
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        with open(os.path.join(os.environ["OUT"], "reward_overhead.json"), "w") as f:
            json.dump(result, f, indent=2)
    return result


def print_table(r: dict) -> None:
    print(f"| scoring {r['samples']} samples (median of {r['repeats']}) | seconds | per sample |")
    print("|---|---|---|")
    for name, label in (("pool", f"{r['workers']} scoring processes"), ("driver", "in the driver (num_workers=0)")):
        median = r[f"{name}_s"]["median"]
        print(f"| {label} | {median:.3f} | {median / r['samples'] * 1e6:.0f} µs |")
    if "hung" in r:
        h = r["hung"]
        print(f"\n{h['samples']} hung samples, reward.timeout_s={h['timeout_s']:g}: the batch took "
              f"{h['elapsed_s']:.2f} s ({h['timeouts']:.0f} timeouts; one after another: "
              f"{h['samples'] * h['timeout_s']:g} s)")


if __name__ == "__main__":
    main()
