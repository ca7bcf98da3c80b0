"""examples/data_preprocess/arithmetic.py: disjoint splits over an operand range, and the sloppy teacher's carries."""

from __future__ import annotations

import importlib.util
import os

import pyarrow.parquet as pq
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def arithmetic():
    path = os.path.join(REPO, "examples", "data_preprocess", "arithmetic.py")
    spec = importlib.util.spec_from_file_location("arithmetic", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read(path) -> list[dict]:
    return pq.read_table(path).to_pylist()


def operands(row) -> tuple[int, int]:
    a, b = row["extra_info"]["question"].removesuffix("=?").split("+")
    return int(a), int(b)


def test_to_row_forgets_only_a_needed_carry(arithmetic):
    assert arithmetic.to_row(57, 68, "train", 0, forget_carry=True)["extra_info"]["answer"] == "#### 115"
    assert arithmetic.to_row(57, 68, "train", 0, forget_carry=True)["reward_model"]["ground_truth"] == "125"
    assert arithmetic.to_row(52, 36, "train", 0, forget_carry=True)["extra_info"]["answer"] == "#### 88"  # no carry
    assert arithmetic.to_row(57, 68, "train", 0)["extra_info"]["answer"] == "#### 125"


def test_worked_answers_column_by_column(arithmetic):
    assert arithmetic.worked_answer(57, 68) == "7+8=15, 5+6+1=12, #### 125"
    assert arithmetic.worked_answer(57, 68, forget_carry=True) == "7+8=15, 5+6=11, #### 115"
    assert arithmetic.worked_answer(52, 36, forget_carry=True) == "2+6=8, 5+3=8, #### 88"  # nothing to forget
    assert arithmetic.worked_answer(95, 8) == "5+8=13, 9+0+1=10, #### 103"
    row = arithmetic.to_row(57, 68, "train", 0, forget_carry=True, chain_of_thought=True)
    assert row["extra_info"]["answer"] == "7+8=15, 5+6=11, #### 115" and row["reward_model"]["ground_truth"] == "125"


@pytest.mark.parametrize("slip", [0.0, 1.0])
def test_splits_and_slips(arithmetic, tmp_path, slip):
    written = arithmetic.main(["--local_save_dir", str(tmp_path), "--min_operand", "10", "--max_operand", "19",
                               "--test_size", "20", "--val_size", "10", "--carry_slip", str(slip), "--seed", "3"])
    splits = {name: read(path) for name, path in written.items()}
    assert {name: len(rows) for name, rows in splits.items()} == {"train": 70, "test": 20, "val": 10}
    pairs = {name: {operands(r) for r in rows} for name, rows in splits.items()}
    assert pairs["train"] | pairs["test"] | pairs["val"] == {(a, b) for a in range(10, 20) for b in range(10, 20)}
    assert not (pairs["train"] & pairs["test"]) and not (pairs["train"] & pairs["val"])
    for name, rows in splits.items():
        for row in rows:
            a, b = operands(row)
            assert row["reward_model"]["ground_truth"] == str(a + b)
            carry = a % 10 + b % 10 >= 10
            forgotten = name == "train" and slip == 1.0 and carry
            assert row["extra_info"]["answer"] == f"#### {a + b - 10 if forgotten else a + b}"


def test_carry_slip_is_seeded_and_partial(arithmetic, tmp_path):
    args = ["--max_operand", "99", "--test_size", "0", "--carry_slip", "0.7", "--seed", "1"]
    first = read(arithmetic.main(["--local_save_dir", str(tmp_path / "a"), *args])["train"])
    again = read(arithmetic.main(["--local_save_dir", str(tmp_path / "b"), *args])["train"])
    assert first == again
    carried = [r for r in first if sum(x % 10 for x in operands(r)) >= 10]
    forgotten = sum(r["extra_info"]["answer"] != f"#### {r['reward_model']['ground_truth']}" for r in carried)
    assert len(carried) == 4500 and 0.67 < forgotten / len(carried) < 0.73  # 0.7 ± 4 standard errors (0.0068 each)


def test_chain_of_thought_rows_score_like_their_sums(arithmetic, tmp_path):
    from verlx.reward.scores import default_compute_score

    written = arithmetic.main(["--local_save_dir", str(tmp_path), "--min_operand", "10", "--test_size", "50",
                               "--chain_of_thought", "--seed", "2"])
    for row in read(written["test"]):
        a, b = operands(row)
        assert row["extra_info"]["answer"] == arithmetic.worked_answer(a, b)
        truth = row["reward_model"]["ground_truth"]
        assert default_compute_score("arithmetic", row["extra_info"]["answer"], truth) == 1


def test_operand_range_is_checked(arithmetic, tmp_path):
    with pytest.raises(ValueError, match="--min_operand 50 must be within 0..--max_operand 40"):
        arithmetic.main(["--local_save_dir", str(tmp_path), "--min_operand", "50", "--max_operand", "40"])
    with pytest.raises(SystemExit):
        arithmetic.main(["--local_save_dir", str(tmp_path), "--carry_slip", "1.5"])
    with pytest.raises(SystemExit):
        arithmetic.main(["--local_save_dir", str(tmp_path), "--max_operand", "100", "--chain_of_thought"])
