"""examples/data_preprocess: GSM8K (the real data) and the synthetic arithmetic set, read back with pyarrow."""

from __future__ import annotations

import importlib.util
import json
import os

import pyarrow.parquet as pq
import pytest

from verlx.reward.scores import default_compute_score
from verlx.reward.scores.gsm8k import compute_score

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GSM8K_DIR = "/work/shared/data/gsm8k"
needs_gsm8k = pytest.mark.skipif(not os.path.isdir(GSM8K_DIR), reason=f"GSM8K copy not found at {GSM8K_DIR}")


def load_script(name: str):
    spec = importlib.util.spec_from_file_location(
        f"preprocess_{name}", os.path.join(REPO, "examples", "data_preprocess", f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def gsm8k_parquet(tmp_path_factory):
    out = tmp_path_factory.mktemp("gsm8k")
    written = load_script("gsm8k").main(["--local_dataset_path", GSM8K_DIR, "--local_save_dir", str(out)])
    return {split: pq.read_table(path).to_pylist() for split, path in written.items()}, out


@needs_gsm8k
def test_gsm8k_row_counts_and_schema(gsm8k_parquet):
    splits, out = gsm8k_parquet
    assert len(splits["train"]) == 7473 and len(splits["test"]) == 1319
    assert sorted(os.listdir(out)) == ["test.parquet", "train.parquet"]  # no temp files left behind
    with open(os.path.join(GSM8K_DIR, "test.jsonl")) as f:
        first = json.loads(f.readline())
    row = splits["test"][0]
    assert row == {
        "data_source": "openai/gsm8k",
        "prompt": [
            {
                "role": "user",
                "content": first["question"] + ' Let\'s think step by step and output the final answer after "####".',
            }
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "18"},
        "extra_info": {"split": "test", "index": 0, "answer": first["answer"], "question": first["question"]},
    }
    assert [r["extra_info"]["index"] for r in splits["train"]] == list(range(7473))
    assert {r["extra_info"]["split"] for r in splits["train"]} == {"train"}


@needs_gsm8k
def test_gsm8k_commas_are_removed_from_ground_truth(gsm8k_parquet):
    splits, _ = gsm8k_parquet
    with_commas = [
        r
        for r in splits["train"] + splits["test"]
        if "#### " in r["extra_info"]["answer"] and "," in r["extra_info"]["answer"].rsplit("#### ", 1)[1]
    ]
    assert with_commas, "GSM8K has answers like '#### 1,600'"
    for r in with_commas:
        assert r["reward_model"]["ground_truth"] == r["extra_info"]["answer"].rsplit("#### ", 1)[1].strip().replace(
            ",", ""
        )


@needs_gsm8k
def test_every_gsm8k_ground_truth_scores_one_against_its_own_solution(gsm8k_parquet):
    splits, _ = gsm8k_parquet
    rows = splits["train"] + splits["test"]
    scores = [
        compute_score(r["extra_info"]["answer"], r["reward_model"]["ground_truth"], method="strict") for r in rows
    ]
    assert sum(scores) == len(rows) == 8792
    assert (
        default_compute_score("openai/gsm8k", rows[0]["extra_info"]["answer"], rows[0]["reward_model"]["ground_truth"])
        == 1.0
    )
    # and a different sample's answer does not match (the scorer is not trivially 1)
    assert compute_score(rows[0]["extra_info"]["answer"], rows[1]["reward_model"]["ground_truth"]) == 0.0


@needs_gsm8k
def test_gsm8k_single_file_and_parquet_input(tmp_path):
    script = load_script("gsm8k")
    written = script.main(
        ["--local_dataset_path", os.path.join(GSM8K_DIR, "test.jsonl"), "--local_save_dir", str(tmp_path / "a")]
    )
    assert list(written) == ["test"] and pq.read_metadata(written["test"]).num_rows == 1319
    # the hub's parquet layout (main/test-00000-of-00001.parquet) as input
    hub_dir = tmp_path / "hub" / "main"
    hub_dir.mkdir(parents=True)
    import pyarrow as pa

    for split in ("train", "test"):
        with open(os.path.join(GSM8K_DIR, f"{split}.jsonl")) as f:
            records = [json.loads(line) for line in f][:5]
        pq.write_table(pa.Table.from_pylist(records), hub_dir / f"{split}-00000-of-00001.parquet")
    written = script.main(["--local_dataset_path", str(tmp_path / "hub"), "--local_save_dir", str(tmp_path / "b")])
    assert pq.read_table(written["train"]).to_pylist()[0]["reward_model"]["ground_truth"] == "72"


def test_gsm8k_bad_inputs_are_named(tmp_path):
    script = load_script("gsm8k")
    with pytest.raises(FileNotFoundError, match="neither a file nor a directory"):
        script.main(["--local_dataset_path", str(tmp_path / "nope"), "--local_save_dir", str(tmp_path)])
    (tmp_path / "train.jsonl").write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
    with pytest.raises(FileNotFoundError, match="no test file"):
        script.main(["--local_dataset_path", str(tmp_path), "--local_save_dir", str(tmp_path / "o")])
    with pytest.raises(ValueError, match=r"train.jsonl row 0: the answer has no '#### <number>'"):
        script.main(["--local_dataset_path", str(tmp_path / "train.jsonl"), "--local_save_dir", str(tmp_path / "o")])


def test_arithmetic_splits_are_disjoint_deterministic_and_scored_like_gsm8k(tmp_path):
    script = load_script("arithmetic")
    a = script.main(
        ["--local_save_dir", str(tmp_path / "a"), "--max_operand", "20", "--test_size", "41", "--seed", "3"]
    )
    b = script.main(
        ["--local_save_dir", str(tmp_path / "b"), "--max_operand", "20", "--test_size", "41", "--seed", "3"]
    )
    c = script.main(
        ["--local_save_dir", str(tmp_path / "c"), "--max_operand", "20", "--test_size", "41", "--seed", "4"]
    )
    train, test = (pq.read_table(a[s]).to_pylist() for s in ("train", "test"))
    # 21 * 21 = 441 pairs: 41 test, the other 400 train
    assert (len(train), len(test)) == (400, 41)
    questions = lambda rows: {r["extra_info"]["question"] for r in rows}  # noqa: E731
    assert questions(train).isdisjoint(questions(test))
    assert len(questions(train) | questions(test)) == 441
    assert pq.read_table(b["test"]).to_pylist() == test
    assert pq.read_table(c["test"]).to_pylist() != test
    row = test[0]
    x, y = map(int, row["extra_info"]["question"].removesuffix("=?").split("+"))
    assert row == {
        "data_source": "arithmetic",
        "prompt": [{"role": "user", "content": f"{x}+{y}=?"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": str(x + y)},
        "extra_info": {"split": "test", "index": 0, "answer": f"#### {x + y}", "question": f"{x}+{y}=?"},
    }
    assert all(
        default_compute_score("arithmetic", r["extra_info"]["answer"], r["reward_model"]["ground_truth"]) == 1.0
        for r in train
    )
    assert default_compute_score("arithmetic", f"#### {x + y + 1}", row["reward_model"]["ground_truth"]) == 0.0


def test_arithmetic_sizes(tmp_path):
    script = load_script("arithmetic")
    written = script.main(
        ["--local_save_dir", str(tmp_path), "--max_operand", "9", "--test_size", "10", "--train_size", "25"]
    )
    assert [pq.read_metadata(written[s]).num_rows for s in ("train", "test")] == [25, 10]
    with pytest.raises(ValueError, match=r"100 pairs, fewer than --test_size 90 \(\+ --val_size\) \+ --train_size 11"):
        script.main(
            ["--local_save_dir", str(tmp_path), "--max_operand", "9", "--test_size", "90", "--train_size", "11"]
        )


def test_geo3k_rows_in_verl_vision_schema(tmp_path):
    """geo3k.py on rows in the hub's layout (images, problem, answer): veRL's row schema, images kept as they are;
    a problem whose <image> placeholders do not match its images is refused naming the file and row."""
    from verlx.config.loader import DataError
    from verlx.data import write_parquet_atomic

    image = {"bytes": b"\x89PNG fake", "path": None}
    raw = tmp_path / "raw"
    write_parquet_atomic([{"images": [image], "problem": "<image>Find x.", "answer": "3"}],
                         raw / "data" / "train-00000-of-00001.parquet")
    write_parquet_atomic([{"images": [image, image], "problem": "<image>Compare.", "answer": "2"}],
                         raw / "data" / "test-00000-of-00001.parquet")
    script = load_script("geo3k")
    with pytest.raises(DataError, match=r"test-00000-of-00001.parquet row 0: the problem has 1 <image> "
                                        "placeholders for 2 images"):
        script.main(["--local_dataset_path", str(raw), "--local_save_dir", str(tmp_path / "out")])
    write_parquet_atomic([{"images": [image], "problem": "Compare <image>.", "answer": "2"}],
                         raw / "data" / "test-00000-of-00001.parquet")
    written = script.main(["--local_dataset_path", str(raw), "--local_save_dir", str(tmp_path / "out")])
    (row,) = pq.read_table(written["train"]).to_pylist()
    assert row["data_source"] == "hiyouga/geometry3k" and row["images"] == [image]
    assert row["prompt"] == [{"role": "user", "content": "<image>Find x. " + script.INSTRUCTION}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "3"}
    assert row["extra_info"] == {"split": "train", "index": 0, "answer": "3", "question": "<image>Find x."}
