"""The task of benchmarks/learning_gpu.py: multi-step arithmetic word problems with worked solutions (veRL schema).

    Ann has 23 pens. Ann buys 15, then loses 8, then gives away 4. How many pens does Ann have?
    23+15=38
    38-8=30
    30-4=26
    #### 26

Every value stays within 0..99 (one or two digits), 2 to 4 operations per problem; the verbs name the operation.
The training split's worked solutions come from an imperfect teacher: for the verbs in MISREAD it adds instead of
subtracting with probability `teacher_error` (the rest of its solution is consistent arithmetic from the wrong
line, so its final answer is wrong). The ground truth is always the correct answer. A model fit to the teacher
decodes greedily the teacher's more likely choice, so with teacher_error > 0.5 it gets a problem right only when no
MISREAD verb occurs in it (the `greedy_teacher_ceiling` printed with the data), while sampling at temperature 1
still finds the right operation in 1 − teacher_error of the cases: an error a verifier-driven RL step can fix, and
a starting accuracy set by the data rather than by when SFT stops. Validation and test solutions are correct.

Questions are unique across splits (test and validation problems are drawn first, the training split excludes
them); the same seed gives the same files.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

DATA_SOURCE = "arithmetic"  # scored by the strict "#### n" rule (verlx's built-in score and benchmarks/peer_reward.py)
NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jin", "Kai", "Lea")
ITEMS = ("apples", "pens", "coins", "books", "cards", "shells", "stamps", "marbles")
ADD_VERBS = ("buys", "finds", "wins")
SUB_VERBS = ("sells", "loses", "gives away")
MISREAD = frozenset({"loses", "gives away"})  # the teacher's systematic slip: + instead of −
MAX_VALUE = 99
MAX_AMOUNT = 29


@dataclass(frozen=True)
class Problem:
    name: str
    item: str
    start: int
    ops: tuple[tuple[str, int], ...]  # (verb, amount)

    def question(self) -> str:
        steps = ", then ".join(f"{verb} {amount}" for verb, amount in self.ops)
        return f"{self.name} has {self.start} {self.item}. {self.name} {steps}. How many {self.item} does " \
               f"{self.name} have?"

    def answer(self) -> int:
        return self.start + sum(amount if verb in ADD_VERBS else -amount for verb, amount in self.ops)

    def solution(self, slips: tuple[bool, ...] = ()) -> str:
        """The worked solution; slips[i] makes operation i an addition whatever its verb."""
        lines, value = [], self.start
        for i, (verb, amount) in enumerate(self.ops):
            add = verb in ADD_VERBS or (i < len(slips) and slips[i])
            result = value + amount if add else value - amount
            lines.append(f"{value}{'+' if add else '-'}{amount}={result}")
            value = result
        return "\n".join(lines) + f"\n#### {value}"


def draw_problem(rng: random.Random, min_ops: int, max_ops: int) -> Problem:
    """A problem whose running value stays in 0..MAX_VALUE; a verb that cannot apply is swapped for the other kind."""
    value = start = rng.randint(5, 60)
    ops = []
    for _ in range(rng.randint(min_ops, max_ops)):
        verb = rng.choice(ADD_VERBS + SUB_VERBS)
        if verb in SUB_VERBS and value < 1:
            verb = rng.choice(ADD_VERBS)
        elif verb in ADD_VERBS and value >= MAX_VALUE:
            verb = rng.choice(SUB_VERBS)
        room = MAX_VALUE - value if verb in ADD_VERBS else value
        amount = rng.randint(1, min(MAX_AMOUNT, room))
        value += amount if verb in ADD_VERBS else -amount
        ops.append((verb, amount))
    return Problem(rng.choice(NAMES), rng.choice(ITEMS), start, tuple(ops))


def teacher_slips(problem: Problem, rng: random.Random, teacher_error: float) -> tuple[bool, ...]:
    return tuple(verb in MISREAD and rng.random() < teacher_error for verb, _ in problem.ops)


def to_row(problem: Problem, split: str, index: int, solution: str) -> dict:
    question = problem.question()
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(problem.answer())},
        "extra_info": {"split": split, "index": index, "answer": solution, "question": question},
    }


def make_splits(sizes: dict[str, int], seed: int, teacher_error: float, min_ops: int = 2,
                max_ops: int = 4) -> dict[str, list[dict]]:
    """Rows of each split in the order given (held-out splits first), questions unique across all splits. Only the
    "train" split's solutions come from the teacher."""
    if not 0.0 <= teacher_error <= 1.0:
        raise ValueError(f"teacher_error must be within [0, 1], got {teacher_error}")
    if not 1 <= min_ops <= max_ops:
        raise ValueError(f"need 1 <= min_ops <= max_ops, got {min_ops}, {max_ops}")
    rng, teacher = random.Random(seed), random.Random(seed + 1)
    seen: set[str] = set()
    splits: dict[str, list[dict]] = {}
    for split, size in sizes.items():
        rows: list[dict] = []
        attempts = 0
        while len(rows) < size:
            attempts += 1
            if attempts > 20 * size + 1000:
                raise ValueError(f"could not draw {size} unique {split} problems (got {len(rows)})")
            problem = draw_problem(rng, min_ops, max_ops)
            if problem.question() in seen:
                continue
            seen.add(problem.question())
            slips = teacher_slips(problem, teacher, teacher_error) if split == "train" else ()
            rows.append(to_row(problem, split, len(rows), problem.solution(slips)))
        splits[split] = rows
    return splits


def solution_is_correct(row: dict) -> bool:
    return row["extra_info"]["answer"].rsplit("#### ", 1)[1] == row["reward_model"]["ground_truth"]


def greedy_teacher_ceiling(rows: list[dict]) -> float:
    """The share of problems with no MISREAD verb: what a model that decodes the teacher's likelier choice gets
    right when teacher_error > 0.5 and its arithmetic is perfect."""
    clean = sum(not any(verb in row["prompt"][0]["content"] for verb in MISREAD) for row in rows)
    return clean / max(len(rows), 1)
