"""A synthetic addition set "a+b=?" → "#### a+b" for the CPU quick start (veRL schema).

    python examples/data_preprocess/arithmetic.py --local_save_dir ~/data/arithmetic

Prompts are short on purpose: the quick-start model is a tiny character-level model. Every pair (a, b) with
0 <= a, b <= --max_operand is shuffled with --seed; the first --test_size pairs are the test set and the next
--train_size (default: all the rest) the training set, so no test question is ever trained on. Answers are
scored like GSM8K (the number after "#### ").
"""

from __future__ import annotations

import argparse
import os
import random
import sys

try:
    from verlx.data.parquet import write_parquet_atomic
except ImportError:  # run from a source checkout without `pip install -e .`
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    from verlx.data.parquet import write_parquet_atomic

DATA_SOURCE = "arithmetic"


def to_row(a: int, b: int, split: str, index: int) -> dict:
    question = f"{a}+{b}=?"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index, "answer": f"#### {a + b}", "question": question},
    }


def split_pairs(max_operand: int, test_size: int, train_size: int | None, seed: int):
    """(train pairs, test pairs): disjoint, deterministic for a seed."""
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if test_size < 0 or (train_size is not None and train_size < 0):
        raise ValueError("--test_size and --train_size must not be negative")
    available = len(pairs) - test_size
    if available < 0 or (train_size is not None and train_size > available):
        raise ValueError(
            f"--max_operand {max_operand} gives {len(pairs)} pairs, fewer than --test_size {test_size} + "
            f"--train_size {train_size}"
        )
    random.Random(seed).shuffle(pairs)
    test = pairs[:test_size]
    train = pairs[test_size:] if train_size is None else pairs[test_size : test_size + train_size]
    return train, test


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_save_dir", default="~/data/arithmetic")
    parser.add_argument("--max_operand", type=int, default=99, help="operands are 0..max_operand")
    parser.add_argument("--test_size", type=int, default=500)
    parser.add_argument("--train_size", type=int, default=None, help="default: every pair not in the test set")
    parser.add_argument("--val_size", type=int, default=0,
                        help="also write val.parquet: held-out pairs disjoint from train and test (e.g. for SFT "
                             "early stopping, so the test set stays unseen by every training decision)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    train, test = split_pairs(args.max_operand, args.test_size + args.val_size, args.train_size, args.seed)
    splits = [("train", train), ("test", test[: args.test_size])]
    if args.val_size:
        splits.append(("val", test[args.test_size:]))
    written = {}
    for split, pairs in splits:
        rows = [to_row(a, b, split, i) for i, (a, b) in enumerate(pairs)]
        written[split] = write_parquet_atomic(
            rows, os.path.join(os.path.expanduser(args.local_save_dir), f"{split}.parquet")
        )
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    main()
