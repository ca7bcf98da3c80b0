"""RLHFDataset on real parquet files with a real (tiny, character-level) tokenizer."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from helpers.tiny_tokenizer import build_tiny_tokenizer
from verlx.config.loader import DataError
from verlx.config.run import DataConfig
from verlx.data import RLHFDataset, write_parquet_atomic
from verlx.protocol import DataProto, collate_rows

# The chat template wraps content c as "<|im_start|>user\n" + c + "<|im_end|>\n<|im_start|>assistant\n":
# <|im_start|> (1) + "user\n" (5) + c + <|im_end|> (1) + "\n" (1) + <|im_start|> (1) + "assistant\n" (10) = len(c) + 19.
TEMPLATE_TOKENS = 19


def row(content, source="arithmetic", truth="3", i=0, **extra):
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": content}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        "extra_info": {"split": "train", "index": i},
        **extra,
    }


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer()


def write(tmp_path, name, rows):
    return write_parquet_atomic(rows, tmp_path / name)


def test_row_layout_left_padding_and_positions(tmp_path, tokenizer):
    path = write(tmp_path, "a.parquet", [row("1+2=?"), row("10+20=?", truth="30", i=1)])
    ds = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=32, return_raw_chat=True, return_full_prompt=True))
    assert len(ds) == 2
    r = ds[1]
    text = "<|im_start|>user\n10+20=?<|im_end|>\n<|im_start|>assistant\n"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    n = len("10+20=?") + TEMPLATE_TOKENS  # 26
    assert len(ids) == n == 26
    pad = tokenizer.pad_token_id
    assert r["input_ids"].dtype == torch.long and r["input_ids"].shape == (32,)
    assert r["input_ids"].tolist() == [pad] * 6 + ids
    assert r["attention_mask"].tolist() == [0] * 6 + [1] * 26
    assert r["position_ids"].tolist() == [0] * 6 + list(range(26))
    assert r["raw_prompt_ids"] == ids
    assert r["full_prompt"] == text
    assert r["raw_prompt"] == [{"role": "user", "content": "10+20=?"}]
    assert r["data_source"] == "arithmetic" and r["ability"] == "math" and r["index"] == 1
    assert r["reward_model"] == {"style": "rule", "ground_truth": "30"}
    assert r["extra_info"] == {"split": "train", "index": 1}


def test_get_batch_equals_collated_rows(tmp_path, tokenizer):
    path = write(tmp_path, "a.parquet", [row("x" * k, i=k) for k in range(1, 9)])
    ds = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=40))
    indices = [5, 0, 7, 5]
    batch = ds.get_batch(indices)
    rows = collate_rows(ds[i] for i in indices)
    assert isinstance(batch, DataProto) and len(batch) == 4
    for key in ("input_ids", "attention_mask", "position_ids"):
        assert torch.equal(batch.batch[key], rows.batch[key])
    for key in batch.non_tensor_batch:
        assert list(batch.non_tensor_batch[key]) == list(rows.non_tensor_batch[key])
    assert batch.batch["attention_mask"].sum(-1).tolist() == [6 + 19, 1 + 19, 8 + 19, 6 + 19]
    assert "raw_prompt" not in batch.non_tensor_batch and "full_prompt" not in batch.non_tensor_batch


def test_several_files_concatenate_and_index_is_a_global_row_id(tmp_path, tokenizer):
    a = write(tmp_path, "a.parquet", [row("a", i=0), row("b", i=1)])
    b = write(tmp_path, "b.parquet", [row("c", source="openai/gsm8k", i=0, extra_col=7)])
    ds = RLHFDataset([a, b], tokenizer, DataConfig(max_prompt_length=32))
    assert [ds[i]["index"] for i in range(3)] == [0, 1, 2]
    assert [ds[i]["data_source"] for i in range(3)] == ["arithmetic", "arithmetic", "openai/gsm8k"]
    assert [ds[i]["extra_col"] for i in range(3)] == [None, None, 7]  # extra columns pass through
    assert len(RLHFDataset([a, b], tokenizer, DataConfig(max_prompt_length=32), max_samples=2)) == 2


@pytest.mark.parametrize(
    "mode, kept",
    [
        # content "abcdefghij" → 29 tokens; keep 25 of them
        ("left", lambda ids: ids[4:]),
        ("right", lambda ids: ids[:25]),
        ("middle", lambda ids: ids[:12] + ids[-13:]),
    ],
)
def test_truncation_modes(tmp_path, tokenizer, mode, kept):
    path = write(tmp_path, "a.parquet", [row("abcdefghij")])
    full = tokenizer("<|im_start|>user\nabcdefghij<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)[
        "input_ids"
    ]
    assert len(full) == 29
    ds = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=25, truncation=mode))
    assert ds[0]["raw_prompt_ids"] == kept(full)
    assert ds[0]["input_ids"].tolist() == kept(full)
    assert ds[0]["attention_mask"].sum() == 25


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_is_reported_with_counts(tmp_path, tokenizer, caplog, mode):
    rows = [row("x" * k, i=k) for k in (1, 7, 6, 12, 3)]  # lengths 20, 26, 25, 31, 22: two over 25, by 1 and 6
    path = write(tmp_path, "a.parquet", rows)
    with caplog.at_level(logging.INFO, logger="verlx.data.rl_dataset"):
        ds = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=25, truncation=mode))
    assert ds.prompt_lengths.tolist() == [20, 25, 25, 25, 22] and ds.num_truncated == 2
    (record,) = [r for r in caplog.records if "RLHFDataset" in r.getMessage()]
    assert record.levelno == logging.WARNING
    assert (f"5 of 5 rows kept; 2 prompts longer than data.max_prompt_length=25 cut by data.truncation={mode} "
            "(7 tokens removed in all, at most 6 from one prompt)") in record.getMessage()


def test_nothing_to_truncate_reports_no_cut(tmp_path, tokenizer, caplog):
    path = write(tmp_path, "a.parquet", [row("x", i=0), row("yy", i=1)])
    with caplog.at_level(logging.INFO, logger="verlx.data.rl_dataset"):
        ds = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=25, truncation="left"))
    assert ds.num_truncated == 0
    (record,) = [r for r in caplog.records if "RLHFDataset" in r.getMessage()]
    assert record.levelno == logging.INFO and record.getMessage().endswith("2 of 2 rows kept")


def test_truncation_error_names_file_row_length_and_keys(tmp_path, tokenizer):
    path = write(tmp_path, "long.parquet", [row("ok"), row("x" * 30)])
    with pytest.raises(ValueError) as e:
        RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=25))
    message = str(e.value)
    assert "long.parquet row 1" in message and "49 tokens" in message  # 30 + 19
    assert "data.max_prompt_length=25" in message and "data.filter_overlong_prompts" in message
    assert "data.truncation" in message
    with pytest.raises(ValueError, match="data.truncation must be one of error, left, middle, right"):
        RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=25, truncation="top"))


def test_filter_overlong_prompts_drops_and_reports(tmp_path, tokenizer, caplog):
    rows = [row("x" * k, i=k) for k in (1, 7, 6, 12, 3)]  # lengths 20, 26, 25, 31, 22
    path = write(tmp_path, "a.parquet", rows)
    with caplog.at_level(logging.WARNING, logger="verlx.data.rl_dataset"):
        ds = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=25, filter_overlong_prompts=True))
    assert len(ds) == 3 and ds.num_filtered == 2
    assert [ds[i]["index"] for i in range(3)] == [0, 2, 4]
    assert ds.prompt_lengths.tolist() == [20, 25, 22]
    assert (
        "3 of 5 rows kept" in caplog.text and "2 prompts longer than data.max_prompt_length=25 dropped" in caplog.text
    )


def test_filter_with_worker_processes_matches_in_process(tmp_path, tokenizer):
    rows = [row("y" * (k % 17 + 1), i=k) for k in range(60)]
    path = write(tmp_path, "a.parquet", rows)
    one = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=30, filter_overlong_prompts=True))
    two = RLHFDataset(
        path,
        tokenizer,
        DataConfig(max_prompt_length=30, filter_overlong_prompts=True, filter_overlong_prompts_workers=2),
    )
    # contents of 12..17 characters (k % 17 > 10) are longer than 30 - 19 = 11 tokens of content
    assert one.num_filtered == two.num_filtered == sum(1 for k in range(60) if k % 17 > 10) == 18
    all_rows = list(range(len(one)))
    assert torch.equal(one.get_batch(all_rows).batch["input_ids"], two.get_batch(all_rows).batch["input_ids"])


def test_missing_file_and_missing_columns(tmp_path, tokenizer):
    with pytest.raises(DataError, match="parquet file not found: .*nope.parquet"):
        RLHFDataset(str(tmp_path / "nope.parquet"), tokenizer, DataConfig())
    path = write(tmp_path, "a.parquet", [{"question": "q", "data_source": "x"}])
    with pytest.raises(DataError) as e:
        RLHFDataset(path, tokenizer, DataConfig())
    message = str(e.value)
    assert "no column 'prompt' (data.prompt_key)" in message and "a.parquet" in message
    assert "['data_source', 'question']" in message
    path = write(tmp_path, "b.parquet", [{"prompt": [{"role": "user", "content": "q"}]}])
    with pytest.raises(DataError, match="no column 'data_source' \\(data.reward_fn_key\\)"):
        RLHFDataset(path, tokenizer, DataConfig())


BAD_PROMPTS = [
    ("a plain string", "malformed prompt"),
    ([{"role": "user"}], "malformed prompt"),
    ([], "malformed prompt"),
    ([{"role": "user", "content": "  \n\t "}], "whitespace-only prompt"),
]


@pytest.mark.parametrize("prompt, kind", BAD_PROMPTS)
def test_bad_rows_raise_with_file_and_row(tmp_path, tokenizer, prompt, kind):
    # pyarrow needs one type per column, so each bad prompt goes in its own file next to a good row
    bad = dict(row("ok"), prompt=prompt)
    path = write(
        tmp_path, "bad.parquet", [row("fine"), bad] if isinstance(prompt, list) else [dict(row("x"), prompt=prompt)]
    )
    bad_row = 1 if isinstance(prompt, list) else 0
    with pytest.raises(ValueError) as e:
        RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=32))
    assert f"bad.parquet row {bad_row}: {kind}" in str(e.value) and "data.skip_bad_rows=true" in str(e.value)


def test_skip_bad_rows_counts_reasons(tmp_path, tokenizer):
    rows = [
        row("1+1=?"),
        dict(row("x"), prompt=[{"role": "user", "content": "   "}]),
        dict(row("x"), prompt=[{"role": "user", "content": None}]),
        row("2+2=?", i=3),
        dict(row("x"), prompt=[]),
    ]
    path = write(tmp_path, "a.parquet", rows)
    ds = RLHFDataset(path, tokenizer, DataConfig(max_prompt_length=32, skip_bad_rows=True))
    assert len(ds) == 2 and [ds[i]["index"] for i in range(2)] == [0, 3]
    assert ds.num_skipped == 3
    assert ds.skip_reasons == {"whitespace-only prompt": 1, "malformed prompt": 2}
    assert [(s.row, s.reason.split(":")[0]) for s in ds.skipped] == [
        (1, "whitespace-only prompt"),
        (2, "malformed prompt"),
        (4, "malformed prompt"),
    ]
    only_bad = write(tmp_path, "b.parquet", [dict(row("x"), prompt=[])])
    with pytest.raises(ValueError, match="no usable prompts .* 1 bad rows skipped"):
        RLHFDataset(only_bad, tokenizer, DataConfig(max_prompt_length=32, skip_bad_rows=True))


def test_chat_template_kwargs_are_passed(tmp_path, tokenizer):
    tok = build_tiny_tokenizer()
    tok.chat_template = "{{ prefix }}{% for m in messages %}{{ m['content'] }}{% endfor %}"
    path = write(tmp_path, "a.parquet", [row("abc")])
    ds = RLHFDataset(
        path, tok, DataConfig(max_prompt_length=8, apply_chat_template_kwargs={"prefix": "P:"}, return_full_prompt=True)
    )
    assert ds[0]["full_prompt"] == "P:abc"
    assert ds[0]["attention_mask"].sum() == 5
    tok.chat_template = None
    with pytest.raises(ValueError, match="has no chat template"):
        RLHFDataset(path, tok, DataConfig())


def test_real_gsm8k_loads_fast(tmp_path, tokenizer):
    """7,473 prompts are templated and tokenised once, in batches."""
    import os
    import time

    from test_data_preprocess import GSM8K_DIR, load_script

    if not os.path.isdir(GSM8K_DIR):
        pytest.skip("GSM8K copy not found")
    written = load_script("gsm8k").main(["--local_dataset_path", GSM8K_DIR, "--local_save_dir", str(tmp_path)])
    start = time.perf_counter()
    ds = RLHFDataset(written["train"], tokenizer, DataConfig(max_prompt_length=1024, truncation="left"))
    load_s = time.perf_counter() - start
    assert len(ds) == 7473
    assert load_s < 20, f"loading took {load_s:.1f}s"
    batch = ds.get_batch(np.arange(256))
    first = batch.non_tensor_batch["extra_info"][0]
    assert first["question"].startswith("Natalia sold clips")
    assert batch.batch["attention_mask"].sum(-1).min() > TEMPLATE_TOKENS
