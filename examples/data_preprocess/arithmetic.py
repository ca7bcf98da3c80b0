"""A synthetic addition set "a+b=?" → "#### a+b" for the CPU quick start (veRL schema).

    python examples/data_preprocess/arithmetic.py --local_save_dir ~/data/arithmetic

Prompts are short on purpose: the quick-start model is a tiny character-level model. Every pair (a, b) with
--min_operand <= a, b <= --max_operand is shuffled with --seed; the first --test_size pairs are the test set, the
next --val_size the validation set and the next --train_size (default: all the rest) the training set, so no test
question is ever trained on. Answers are scored like GSM8K (the number after "#### ").

--chain_of_thought writes every answer column by column before the result (operands up to two digits):
"57+68=?" → "7+8=15, 5+6+1=12, #### 125". Each step then needs only a few nearby digits, which the quick start's
tiny model learns within a few hundred SFT steps for every seed tried; the bare "#### 125" it learns at a step count
that varies several-fold with the seed (issue 24).

--carry_slip P writes the training rows' demonstrations (extra_info.answer, what SFT imitates) as a sloppy teacher
would: a sum that needs a carry from the units into the tens is written without it (57+68 → "#### 115", or
"7+8=15, 5+6=11, #### 115") with probability P. Their ground truth (reward_model.ground_truth, what the reward
checks) stays right, and so do the test and validation rows: SFT learns to forget carries, and RL, rewarded for
right answers, can unlearn that.
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


def needs_carry(a: int, b: int) -> bool:
    return a % 10 + b % 10 >= 10


def worked_answer(a: int, b: int, forget_carry: bool = False) -> str:
    """The sum of two operands below 100 column by column: "7+8=15, 5+6+1=12, #### 125" (without the "+1" and
    with its consequence when the carry is forgotten)."""
    forgot = forget_carry and needs_carry(a, b)
    carry = needs_carry(a, b) and not forgot
    units = f"{a % 10}+{b % 10}={a % 10 + b % 10}"
    tens = f"{a // 10}+{b // 10}" + ("+1" if carry else "") + f"={a // 10 + b // 10 + int(carry)}"
    return f"{units}, {tens}, #### {a + b - 10 * forgot}"


def to_row(a: int, b: int, split: str, index: int, forget_carry: bool = False, chain_of_thought: bool = False) -> dict:
    """One row; with `forget_carry` (a sum that needs a carry) the demonstration drops it, the ground truth does not."""
    question = f"{a}+{b}=?"
    shown = a + b - 10 if forget_carry and needs_carry(a, b) else a + b
    answer = worked_answer(a, b, forget_carry) if chain_of_thought else f"#### {shown}"
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(a + b)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def split_pairs(max_operand: int, test_size: int, train_size: int | None, seed: int, min_operand: int = 0):
    """(train pairs, test pairs): disjoint, deterministic for a seed."""
    if not 0 <= min_operand <= max_operand:
        raise ValueError(f"--min_operand {min_operand} must be within 0..--max_operand {max_operand}")
    operands = range(min_operand, max_operand + 1)
    pairs = [(a, b) for a in operands for b in operands]
    if test_size < 0 or (train_size is not None and train_size < 0):
        raise ValueError("--test_size and --train_size must not be negative")
    available = len(pairs) - test_size
    if available < 0 or (train_size is not None and train_size > available):
        raise ValueError(
            f"operands {min_operand}..{max_operand} give {len(pairs)} pairs, fewer than --test_size {test_size} "
            f"(+ --val_size) + --train_size {train_size}"
        )
    random.Random(seed).shuffle(pairs)
    test = pairs[:test_size]
    train = pairs[test_size:] if train_size is None else pairs[test_size : test_size + train_size]
    return train, test


def main(argv: list[str] | None = None) -> dict[str, str]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_save_dir", default="~/data/arithmetic")
    parser.add_argument("--min_operand", type=int, default=0, help="operands are min_operand..max_operand")
    parser.add_argument("--max_operand", type=int, default=99, help="operands are min_operand..max_operand")
    parser.add_argument("--test_size", type=int, default=500)
    parser.add_argument("--train_size", type=int, default=None, help="default: every pair not in the test set")
    parser.add_argument("--val_size", type=int, default=0,
                        help="also write val.parquet: held-out pairs disjoint from train and test (e.g. for SFT "
                             "early stopping, so the test set stays unseen by every training decision)")
    parser.add_argument("--carry_slip", type=float, default=0.0,
                        help="probability that a training demonstration forgets the carry of a sum that needs one")
    parser.add_argument("--chain_of_thought", action="store_true",
                        help='answers worked column by column: "7+8=15, 5+6+1=12, #### 125" (operands up to 99)')
    parser.add_argument("--seed", type=int, default=0, help="seed of the split and of the teacher's slips")
    args = parser.parse_args(argv)
    if args.chain_of_thought and args.max_operand > 99:
        parser.error(f"--chain_of_thought works two columns: --max_operand must be at most 99, got {args.max_operand}")
    if not 0.0 <= args.carry_slip <= 1.0:
        parser.error(f"--carry_slip must be within [0, 1], got {args.carry_slip}")

    train, test = split_pairs(args.max_operand, args.test_size + args.val_size, args.train_size, args.seed,
                              args.min_operand)
    splits = [("train", train), ("test", test[: args.test_size])]
    if args.val_size:
        splits.append(("val", test[args.test_size:]))
    slips = random.Random(f"carry_slip-{args.seed}")
    written = {}
    for split, pairs in splits:
        rows = [to_row(a, b, split, i, split == "train" and slips.random() < args.carry_slip, args.chain_of_thought)
                for i, (a, b) in enumerate(pairs)]
        written[split] = write_parquet_atomic(
            rows, os.path.join(os.path.expanduser(args.local_save_dir), f"{split}.parquet")
        )
        print(f"{split}: {len(rows)} rows -> {written[split]}")
    return written


if __name__ == "__main__":
    main()
