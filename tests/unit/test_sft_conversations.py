"""Multi-turn SFT rows (veRL's messages data), packed micro-batches, token-budget micro-batch plans and the
save_freq directories, with hand-counted tokens (the tiny tokenizer: one token per byte, chatml template)."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from verlx.config.loader import DataError
from verlx.data.sft_conversations import ConversationKeys, tokenize_conversations
from verlx.data.sft_dataset import collate, collate_packed, read_parquet_rows
from verlx.models.tiny import build_tokenizer
from verlx.trainer.sft_batches import SFTLayout, plan_micro_batches
from verlx.trainer.sft_checkpoints import keep_newest, resume_problem, saved_steps, write_atomically

IM_END, NEWLINE = 258, 10
CONVERSATION = [{"role": "user", "content": "1+2=?"}, {"role": "assistant", "content": "#### 3"},
                {"role": "user", "content": "x2?"}, {"role": "assistant", "content": "#### 6"}]


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _rows(tmp_path, records, name="conv.parquet"):
    path = str(tmp_path / name)
    pq.write_table(pa.Table.from_pylist(records), path)
    return read_parquet_rows(path)


def test_every_assistant_message_and_its_end_of_turn_carry_loss(tmp_path, tok):
    rows = _rows(tmp_path, [{"messages": CONVERSATION, "tools": None}])
    data = tokenize_conversations(rows, tok, ConversationKeys(), max_length=512)
    # user turn "<|im_start|>user\n1+2=?<|im_end|>\n" = 1+4+1+5+1+1 = 13 tokens, the generation prompt
    # "<|im_start|>assistant\n" 11, the reply "#### 3<|im_end|>\n" 8; then 11 + 11 + 8 again: 62 in all
    assert data.lengths.tolist() == [62] and data.prompt_lengths.tolist() == [24]
    assert np.flatnonzero(data.loss_mask[0]).tolist() == [*range(24, 32), *range(54, 62)]
    assert data.input_ids[0, 24:32].tolist() == [35, 35, 35, 35, 32, 51, IM_END, NEWLINE]
    assert data.input_ids[0, 54:62].tolist() == [35, 35, 35, 35, 32, 54, IM_END, NEWLINE]
    assert data.response_lengths.tolist() == [16]
    # the loss targets: position t predicts token t+1, so positions 23..30 and 53..60
    batch = collate(data, np.array([0]), torch.device("cpu"))
    assert batch["response_positions"].tolist() == [*range(23, 31), *range(53, 61)]
    assert batch["targets"].tolist() == data.input_ids[0, [*range(24, 32), *range(54, 62)]].tolist()


def test_truncation_and_rows_without_a_reply_or_the_wrong_shape(tmp_path, tok):
    rows = _rows(tmp_path, [{"messages": CONVERSATION}])
    with pytest.raises(DataError, match=r"1 conversation\(s\) exceed data.max_length=40 tokens, e.g. .*conv.parquet "
                                        r"row 0 with 62"):
        tokenize_conversations(rows, tok, ConversationKeys(), max_length=40)
    right = tokenize_conversations(rows, tok, ConversationKeys(), max_length=40, truncation="right")
    assert right.lengths.tolist() == [40] and np.flatnonzero(right.loss_mask[0]).tolist() == list(range(24, 32))
    left = tokenize_conversations(rows, tok, ConversationKeys(), max_length=40, truncation="left")
    # the last 40 of 62 tokens: the replies at 24..31 and 54..61 move to 2..9 and 32..39
    assert np.flatnonzero(left.loss_mask[0]).tolist() == [*range(2, 10), *range(32, 40)]
    silent = _rows(tmp_path, [{"messages": CONVERSATION[:1]}], "silent.parquet")
    with pytest.raises(DataError, match=r"silent.parquet row 0 has no assistant message"):
        tokenize_conversations(silent, tok, ConversationKeys(), max_length=512)
    flat = _rows(tmp_path, [{"chat": "hello"}], "flat.parquet")
    with pytest.raises(DataError, match=r"messages_key='chat': .*flat.parquet row 0 is 'hello'; expected a list"):
        tokenize_conversations(flat, tok, ConversationKeys(messages_key="chat"), max_length=512)


def test_a_template_that_rewrites_earlier_turns_is_refused_naming_the_row(tmp_path, tok):
    """A template that shows only the last assistant reply (as reasoning templates drop earlier thoughts)."""
    import copy

    dropping = copy.deepcopy(tok)
    dropping.chat_template = (
        "{%- for m in messages %}{%- if m['role'] != 'assistant' or loop.last %}"
        "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{%- endif %}{%- endfor %}"
        "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
    rows = _rows(tmp_path, [{"messages": CONVERSATION}])
    with pytest.raises(DataError, match=r"conv.parquet row 0: the chat template renders the conversation up to "
                                        r"message 1 differently"):
        tokenize_conversations(rows, dropping, ConversationKeys(), max_length=512)


def test_a_packed_micro_batch_has_the_padded_batchs_targets_split_over_ulysses_ranks(tmp_path, tok):
    short = [{"role": "user", "content": "9?"}, {"role": "assistant", "content": "#### 9"}]
    rows = _rows(tmp_path, [{"messages": CONVERSATION}, {"messages": short}])
    data = tokenize_conversations(rows, tok, ConversationKeys(), max_length=512)
    assert data.lengths.tolist() == [62, 29]  # "9?": 10 + 11 + 8
    padded = collate(data, np.array([0, 1]), torch.device("cpu"))
    whole = collate_packed(data, np.array([0, 1]), torch.device("cpu"))
    assert whole["input_ids"].shape == (1, 91) and whole["cu_seqlens"].tolist() == [0, 62, 91]
    assert whole["targets"].tolist() == padded["targets"].tolist()
    # row 1's positions move from 62 + t (padded width 62) to 62 + t (right after row 0): the same here, and
    # its positions restart at 0
    assert whole["response_positions"].tolist() == padded["response_positions"].tolist()
    assert whole["position_ids"][0, 62:].tolist() == list(range(29))
    quarters = [collate_packed(data, np.array([1, 0]), torch.device("cpu"), rank, 4) for rank in range(4)]
    joined = torch.cat([q["input_ids"] for q in quarters], dim=1)
    # 91 tokens padded to 92 = 4 × 23: a one-token tail of its own
    assert joined.shape == (1, 92) and quarters[0]["cu_seqlens"].tolist() == [0, 29, 91, 92]
    assert joined[0, :29].tolist() == data.input_ids[1, :29].tolist()
    # each rank predicts the loss tokens of its own slice: together, every one of them once
    reordered = collate_packed(data, np.array([1, 0]), torch.device("cpu"))
    assert torch.cat([q["response_positions"] + 23 * r for r, q in enumerate(quarters)]).tolist() == \
        reordered["response_positions"].tolist()
    assert torch.cat([q["targets"] for q in quarters]).tolist() == reordered["targets"].tolist()
    three = collate_packed(data, np.array([0, 1]), torch.device("cpu"), 2, 3)  # 91 → 93; rank 2 holds 62..92
    assert three["input_ids"].shape == (1, 31) and three["cu_seqlens"].tolist() == [0, 62, 91, 93]
    assert three["input_ids"][0, :29].tolist() == data.input_ids[1, :29].tolist()
    # row 1's reply "#### 9<|im_end|>\n" is predicted from its positions 20..27, local 20..27 here
    assert three["response_positions"].tolist() == list(range(20, 28))
    assert three["targets"].tolist() == padded["targets"].tolist()[-8:]


def test_token_budget_micro_batches_are_balanced_and_as_many_on_every_shard():
    lengths = np.array([50, 10, 40, 30, 20, 60, 5, 5])
    batch = np.arange(8)
    one = plan_micro_batches(batch, lengths, SFTLayout(0, 1), 3, token_budget=100)
    # 220 tokens need 3 groups of <= 100: LPT puts 60 | 50, 30 | 40, 20, 10, 5, 5 → sums 60+5+..., all <= 100
    assert len(one) == 3 and sorted(int(lengths[g].sum()) for g in one) == [70, 75, 75]
    assert sorted(np.concatenate(one).tolist()) == list(range(8))
    # two shards of 4 rows: [50, 10, 40, 30] = 130 and [20, 60, 5, 5] = 90; the fuller one needs 2 groups of 80
    shard0 = plan_micro_batches(batch, lengths, SFTLayout(0, 2), 3, token_budget=80)
    shard1 = plan_micro_batches(batch, lengths, SFTLayout(1, 2), 3, token_budget=80)
    assert len(shard0) == len(shard1) == 2
    assert sorted(int(lengths[g].sum()) for g in shard0) == [60, 70]
    # a Ulysses pair shares one shard: ranks 0 and 1 plan the same micro-batches
    pair = [plan_micro_batches(batch, lengths, SFTLayout(r, 4, sp_size=2), 3, token_budget=80) for r in (0, 1)]
    assert [g.tolist() for g in pair[0]] == [g.tolist() for g in pair[1]] == [g.tolist() for g in shard0]
    fixed = plan_micro_batches(batch, lengths, SFTLayout(1, 2), 3)
    assert [g.tolist() for g in fixed] == [[4, 5, 6], [7]]
    with pytest.raises(ValueError, match=r"micro-batches of 55 tokens, fewer than the longest row \(60 tokens\)"):
        plan_micro_batches(batch, lengths, SFTLayout(0, 1), 3, token_budget=55)


def test_save_freq_directories_are_kept_newest_first_and_survive_the_final_save(tmp_path):
    root = str(tmp_path / "ckpt")
    for step in (2, 4, 6, 10):
        os.makedirs(os.path.join(root, f"global_step_{step}"))
    os.makedirs(os.path.join(root, "global_step_x"))
    assert saved_steps(root) == [2, 4, 6, 10]
    assert [os.path.basename(p) for p in keep_newest(root, 2)] == ["global_step_2", "global_step_4"]
    assert saved_steps(root) == [6, 10] and keep_newest(root, None) == []

    def write(tmp):
        os.makedirs(tmp)
        open(os.path.join(tmp, "model.safetensors"), "w").close()

    write_atomically(root, write)  # the final model replaces the directory; its saved steps move along
    assert saved_steps(root) == [6, 10] and os.path.isfile(os.path.join(root, "model.safetensors"))
    assert "holds global_step_10" in resume_problem(root, "auto")
    assert resume_problem(root, "disable") is None and resume_problem(str(tmp_path / "new"), "auto") is None
