"""The learning test's task (tests/e2e/test_learning.py): "the last digit of a 3-digit number".

The prompt is the number, the response is its last digit alone, so the answer is the response's first token (a
mask shifted by one token leaves it out of the loss). The SFT rows come from a sloppy teacher that answers with the
last digit with probability `teacher_accuracy` and with the first digit otherwise: the fine-tuned model copies one
or the other at random, so it is right only sometimes and GRPO has one systematic error to fix.
"""

from __future__ import annotations

import random

DATA_SOURCE = "last_digit"


def compute_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """1 for exactly the right digit (surrounding whitespace ignored), else 0."""
    return float(solution_str.strip() == str(ground_truth))


def constant_score(data_source, solution_str, ground_truth, extra_info=None) -> float:
    """A broken reward: the same score whatever the response (GRPO learns nothing from it)."""
    return 0.5


def rows(numbers, split: str, teacher_accuracy: float, rng: random.Random) -> list[dict]:
    out = []
    for index, number in enumerate(numbers):
        truth = str(number % 10)
        shown = truth if rng.random() < teacher_accuracy else str(number // 100)
        out.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": str(number)}],
            "ability": "copy",
            "reward_model": {"style": "rule", "ground_truth": truth},
            "extra_info": {"split": split, "index": index, "answer": shown},
        })
    return out


def write_splits(directory: str, teacher_accuracy: float, num_test: int = 100, copies: int = 10,
                 seed: int = 0) -> dict:
    """train.parquet (teacher answers, `copies` rows of each number: the teacher's habit, not one answer per number,
    is what SFT can learn) and test.parquet (unseen numbers, right answers) of 100..999."""
    import os

    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(seed)
    numbers = list(range(100, 1000))
    rng.shuffle(numbers)
    paths = {}
    train = [number for number in numbers[num_test:] for _ in range(copies)]
    for split, part, accuracy in (("test", numbers[:num_test], 1.0), ("train", train, teacher_accuracy)):
        paths[split] = os.path.join(directory, f"{split}.parquet")
        pq.write_table(pa.Table.from_pylist(rows(part, split, accuracy, rng)), paths[split])
    return paths
