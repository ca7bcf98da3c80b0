"""Arithmetic parquet files in the project's schema, written by the tests themselves (a, b in 0..99)."""

from __future__ import annotations

import numpy as np


def arithmetic_rows(pairs, split: str) -> list[dict]:
    rows = []
    for index, (a, b) in enumerate(pairs):
        question, answer = f"{a}+{b}=?", str(a + b)
        rows.append(
            {
                "data_source": "arithmetic",
                "prompt": [{"role": "user", "content": question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": answer},
                "extra_info": {"split": split, "index": index, "answer": f"#### {answer}", "question": question},
            }
        )
    return rows


def write_arithmetic(path: str, pairs, split: str) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(arithmetic_rows(pairs, split)), path)
    return path


def disjoint_pairs(num_train: int, num_test: int, seed: int = 0) -> tuple[list, list]:
    """Distinct (a, b) pairs: the first num_train for training, the next num_test held out."""
    order = np.random.default_rng(seed).permutation(100 * 100)[: num_train + num_test]
    pairs = [(int(i // 100), int(i % 100)) for i in order]
    return pairs[:num_train], pairs[num_train:]


if __name__ == "__main__":
    import argparse
    import os

    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", required=True)
    parser.add_argument("--train", type=int, default=5000)
    parser.add_argument("--test", type=int, default=500)
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    train, test = disjoint_pairs(args.train, args.test)
    write_arithmetic(os.path.join(args.output_dir, "train.parquet"), train, "train")
    write_arithmetic(os.path.join(args.output_dir, "test.parquet"), test, "test")
