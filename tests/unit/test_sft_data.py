"""SFT data reading and batching, the validation score and the lr schedule, with hand-computed numbers."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from arithmetic_rows import write_arithmetic
from verlx.config.loader import DataError
from verlx.data.sft_dataset import collate, read_parquet_rows, tokenize_sft
from verlx.models.tiny import build_tokenizer
from verlx.trainer.sft_eval import score_response
from verlx.trainer.sft_trainer import EpochBatches
from verlx.utils.lr_schedules import lr_multiplier

IM_END = 258


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _tokenize(rows, tok, **kwargs):
    options = {"prompt_key": "prompt", "response_key": "extra_info.answer", "end_of_response_id": IM_END,
               "max_length": 512}
    return tokenize_sft(rows, tok, **{**options, **kwargs})


def test_dotted_response_key_and_string_prompts(tmp_path, tok):
    path = str(tmp_path / "qa.parquet")
    pq.write_table(pa.Table.from_pylist([{"question": "2+2=?", "meta": {"solution": {"text": "#### 4"}}}]), path)
    data = _tokenize(read_parquet_rows(path), tok, prompt_key="question", response_key="meta.solution.text")
    # "<|im_start|>user\n2+2=?<|im_end|>\n<|im_start|>assistant\n" = 19 + 5 tokens, then "#### 4" + <|im_end|>
    assert data.prompt_lengths.tolist() == [24] and data.lengths.tolist() == [31]
    assert data.input_ids[0, 24:].tolist() == [35, 35, 35, 35, 32, 52, IM_END]


def test_bad_keys_name_the_key_file_and_row(tmp_path, tok):
    path = write_arithmetic(str(tmp_path / "a.parquet"), [(1, 1), (2, 2)], "train")
    rows = read_parquet_rows(path)
    with pytest.raises(KeyError, match=r"data.response_key='extra_info.answr'.*a.parquet row 0 has no 'answr'"):
        _tokenize(rows, tok, response_key="extra_info.answr")
    with pytest.raises(KeyError, match=r"column 'promt' is not in .*Did you mean 'prompt'\?"):
        _tokenize(rows, tok, prompt_key="promt")
    with pytest.raises(DataError, match=r"data.train_files: .*missing.parquet does not exist"):
        read_parquet_rows(str(tmp_path / "missing.parquet"))


def test_truncation(tmp_path, tok):
    rows = read_parquet_rows(write_arithmetic(str(tmp_path / "a.parquet"), [(1, 2), (12, 34)], "train"))
    # lengths: 24 + 7 = 31 and 26 + 8 = 34
    with pytest.raises(ValueError,
                       match=r"1 row\(s\) exceed data.max_length=32 tokens, e.g. .*a.parquet row 1 with 34"):
        _tokenize(rows, tok, max_length=32)
    left = _tokenize(rows, tok, max_length=32, truncation="left")
    assert left.lengths.tolist() == [31, 32] and left.prompt_lengths.tolist() == [24, 24]
    assert left.input_ids[1, 24:32].tolist() == [35, 35, 35, 35, 32, 52, 54, IM_END]  # the response is intact
    right = _tokenize(rows, tok, max_length=32, truncation="right")
    assert right.lengths.tolist() == [31, 32] and right.prompt_lengths.tolist() == [24, 26]
    assert right.input_ids[1, 26:32].tolist() == [35, 35, 35, 35, 32, 52]  # "#### 4": the tail is cut


def test_collate_targets_are_the_response_tokens(tmp_path, tok):
    rows = read_parquet_rows(write_arithmetic(str(tmp_path / "a.parquet"), [(1, 2), (12, 34)], "train"))
    data = _tokenize(rows, tok)
    batch = collate(data, np.array([1, 0]), torch.device("cpu"))
    # width 34; row 0 (12+34) predicts tokens 26..33 from positions 25..32; row 1 (1+2) tokens 24..30 from 23..29
    assert batch["input_ids"].shape == (2, 34)
    assert batch["response_positions"].tolist() == list(range(25, 33)) + [34 + t for t in range(23, 30)]
    assert batch["targets"].tolist() == [35, 35, 35, 35, 32, 52, 54, IM_END, 35, 35, 35, 35, 32, 51, IM_END]
    assert batch["attention_mask"].sum(1).tolist() == [34, 31]
    same = collate(data, np.array([1, 1]), torch.device("cpu"))
    assert "attention_mask" not in same  # no padding: the causal fast path


def test_epoch_batches_are_seeded_permutations():
    batches = EpochBatches(10, 4, seed=3, shuffle=True)
    assert batches.steps_per_epoch == 2  # the last 2 rows of each epoch's order are dropped
    epoch0 = np.concatenate([batches(0), batches(1)])
    assert len(set(epoch0.tolist())) == 8
    assert np.array_equal(batches(0), EpochBatches(10, 4, seed=3, shuffle=True)(0))
    assert not np.array_equal(batches(2), batches(0))  # epoch 1 reshuffles
    assert EpochBatches(10, 4, seed=3, shuffle=False)(1).tolist() == [4, 5, 6, 7]
    with pytest.raises(ValueError, match="fewer than data.train_batch_size=16"):
        EpochBatches(10, 16, seed=0, shuffle=True)


@pytest.mark.parametrize(
    "response, truth, score",
    [
        ("#### 46", "46", 1.0),
        ("#### 46", "64", 0.0),
        ("the sum is 46", "46", 0.0),  # strict: needs "#### "
        ("#### 1,234", "1234", 1.0),
        ("#### 12 then #### 46", "46", 1.0),  # the last answer counts
        ("#### 46.0", "46", 1.0),  # numeric comparison
        ("####46", "46", 0.0),
        ("#### -3", "-3", 1.0),
        ("#### 4.6.1", "46", 0.0),
    ],
)
def test_sft_validation_uses_the_strict_gsm8k_rule(response, truth, score):
    assert score_response("arithmetic", response, truth) == score


def test_lr_multipliers():
    f = lr_multiplier("cosine", total_steps=10, warmup_steps=2, min_lr_ratio=0.0)
    # warmup (s+1)/2: 0.5, 1.0; then cos over 8 steps: s=6 is halfway → 0.5; s=10 → 0
    assert [f(0), f(1), f(2), f(6), f(10)] == [0.5, 1.0, 1.0, pytest.approx(0.5), pytest.approx(0.0)]
    assert f(4) == pytest.approx(0.5 * (1 + math.cos(math.pi * 2 / 8)))
    g = lr_multiplier("cosine", total_steps=10, warmup_steps=0, min_lr_ratio=0.1)
    assert g(10) == pytest.approx(0.1) and g(0) == 1.0
    assert [lr_multiplier("constant", 10, 0)(s) for s in (0, 5, 9)] == [1.0, 1.0, 1.0]
