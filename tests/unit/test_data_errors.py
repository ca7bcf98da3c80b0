"""Data errors name the file (and the rows where they can be found) and what to do, and the entry points report
them like config errors: exit status 2, the message without a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from helpers.commands import REPO_DIR, assert_no_traceback, run_module
from helpers.tiny_tokenizer import build_tiny_tokenizer
from verlx.config.loader import DataError
from verlx.config.run import DataConfig
from verlx.data import RLHFDataset


def prompt_rows(n):
    return [{"prompt": [{"role": "user", "content": f"question {i} " * 5}], "data_source": "x"} for i in range(n)]


def garbled_parquet(tmp_path, row_group: int, column: int) -> str:
    """6 rows in row groups of 2, with the first page of one column chunk overwritten (its thrift header breaks)."""
    path = str(tmp_path / "garbled.parquet")
    pq.write_table(pa.Table.from_pylist(prompt_rows(6)), path, row_group_size=2)
    chunk = pq.ParquetFile(path).metadata.row_group(row_group).column(column)
    offset = chunk.dictionary_page_offset or chunk.data_page_offset
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(b"\xff" * 12)
    return path


def test_garbled_page_names_the_file_rows_and_column(tmp_path):
    path = garbled_parquet(tmp_path, row_group=1, column=1)  # columns: prompt.role, prompt.content, data_source
    with pytest.raises(DataError) as info:
        RLHFDataset(path, build_tiny_tokenizer(), DataConfig())
    message = str(info.value)
    assert message.startswith(f"{path} is damaged in rows 2 to 3 (row group 2 of 3), column 'prompt' (pyarrow: "
                              "Couldn't deserialize thrift")
    assert message.endswith("write it again with the script that made it (examples/data_preprocess/) or copy it "
                            "again from its source")


def test_truncated_parquet_names_the_footer(tmp_path):
    path = tmp_path / "cut.parquet"
    pq.write_table(pa.Table.from_pylist(prompt_rows(4)), path)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(DataError, match=f"{path} is damaged \\(its footer, which holds the schema and the row index, "
                       "cannot be read: a truncated or partial copy\\?\\)"):
        RLHFDataset(str(path), build_tiny_tokenizer(), DataConfig())


def test_jsonl_given_as_parquet_says_how_to_convert(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in prompt_rows(2)))
    with pytest.raises(DataError) as info:
        RLHFDataset(str(path), build_tiny_tokenizer(), DataConfig())
    assert str(info.value).startswith(
        f"{path} is not a parquet file: it starts with '{{' like JSON or JSON Lines. verlx reads parquet files in "
        "veRL's schema (prompt, data_source, reward_model, ...): convert it with a script in examples/data_preprocess/")


def test_other_files_given_as_parquet(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("prompt,data_source\nhello,x\n")
    with pytest.raises(DataError, match=f"{path} is not a parquet file \\(it does not begin with parquet's magic "
                       "bytes PAR1; pyarrow: .*magic bytes not found"):
        RLHFDataset(str(path), build_tiny_tokenizer(), DataConfig())


def ppo_args(train_file, data_dir, *extra):
    return [f"data.train_files={train_file}", f"data.val_files={data_dir}/test.parquet", "trainer.device=cpu",
            "trainer.n_gpus_per_node=2", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "algorithm.adv_estimator=grpo",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2", *extra]


@pytest.mark.parametrize("problem", ["jsonl", "garbled", "missing column", "too few rows"])
def test_main_ppo_reports_data_errors_with_exit_2(problem, tmp_path, tiny_model_dir, arithmetic_data_dir):
    model = f"actor_rollout_ref.model.path={tiny_model_dir}"
    if problem == "jsonl":
        train = tmp_path / "train.jsonl"
        train.write_text(json.dumps(prompt_rows(1)[0]) + "\n")
        args, expected = ppo_args(train, arithmetic_data_dir, model), f"{train} is not a parquet file"
    elif problem == "garbled":
        train = garbled_parquet(tmp_path, row_group=0, column=2)
        args, expected = ppo_args(train, arithmetic_data_dir, model), f"{train} is damaged in rows 0 to 1"
    elif problem == "missing column":
        args = ppo_args(f"{arithmetic_data_dir}/train.parquet", arithmetic_data_dir, model, "data.prompt_key=question")
        expected = f"{arithmetic_data_dir}/train.parquet has no column 'question' (data.prompt_key)"
    else:
        args = ppo_args(f"{arithmetic_data_dir}/train.parquet", arithmetic_data_dir, model, "data.train_max_samples=4")
        expected = "the dataset has 4 rows, fewer than one batch of 8 (data.train_batch_size)"
    result = run_module(args, cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error: ") and expected in result.stderr
    assert_no_traceback(result)


def test_unknown_estimator_is_a_config_error(tmp_path, tiny_model_dir, arithmetic_data_dir):
    result = run_module(ppo_args(f"{arithmetic_data_dir}/train.parquet", arithmetic_data_dir,
                                 f"actor_rollout_ref.model.path={tiny_model_dir}", "algorithm.adv_estimator=grpoo"),
                        cwd=tmp_path)
    assert result.returncode == 2
    assert ("error: invalid config (1 problem):\n  - algorithm.adv_estimator: unknown advantage estimator 'grpoo' "
            "(config key algorithm.adv_estimator)") in result.stderr and "Did you mean 'grpo'?" in result.stderr
    assert_no_traceback(result)


# ---------------------------------------------------------------------- examples/data_preprocess/gsm8k.py
GSM8K_SCRIPT = os.path.join(REPO_DIR, "examples", "data_preprocess", "gsm8k.py")
GOOD = {"question": "What is 2+3?", "answer": "2+3=5\n#### 5"}


def run_gsm8k(path, out):
    return subprocess.run([sys.executable, GSM8K_SCRIPT, "--local_dataset_path", str(path), "--local_save_dir",
                           str(out)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": REPO_DIR})


def test_gsm8k_broken_json_line_names_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n" + '{"question": "q" "answer": "#### 1"}\n' + json.dumps(GOOD) + "\n")
    result = run_gsm8k(path, tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr == (f"error: {path} line 3: not valid JSON (Expecting ',' delimiter, column 18); "
                             "each line must be one JSON object with 'question' and 'answer' (JSON Lines): fix or "
                             "delete that line\n")
    assert not (tmp_path / "out").exists()


def test_gsm8k_record_without_question_is_named(tmp_path):
    path = tmp_path / "test.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({"q": "x", "answer": "#### 1"}) + "\n")
    result = run_gsm8k(path, tmp_path / "out")
    assert result.returncode == 2
    assert result.stderr.startswith(f"error: {path} row 1: expected an object with string fields 'question' and "
                                    "'answer', got")
    assert_no_traceback(result)


def test_gsm8k_garbled_parquet_input_is_named(tmp_path):
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist([GOOD] * 4), path)
    path.write_bytes(path.read_bytes()[:-20])
    result = run_gsm8k(path, tmp_path / "out")
    assert result.returncode == 2 and result.stderr.startswith(f"error: {path} is damaged (its footer")
    assert_no_traceback(result)
