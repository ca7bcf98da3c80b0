"""SFT data: parquet rows → chat-templated prompt + response token ids, and padded micro-batches of them.

A row's prompt (chat messages, or a plain string taken as one user message) goes through the tokenizer's chat
template with the generation prompt; the response (a column, or a dotted path into a dict column such as
`extra_info.answer`) follows it, closed by the end-of-response token. Only response tokens carry loss.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verlx.config.loader import DataError
from verlx.utils.paths import expand_path

TRUNCATIONS = ("error", "left", "right")


@dataclass
class ParquetRows:
    """Rows of one or more parquet files, with enough provenance to name the file and row of a bad value."""

    table: Any  # pyarrow.Table
    files: list[str]
    starts: list[int]  # first global row of each file

    def locate(self, row: int) -> str:
        i = int(np.searchsorted(self.starts, row, side="right")) - 1
        return f"{self.files[i]} row {row - self.starts[i]}"

    def __len__(self) -> int:
        return self.table.num_rows

    def column(self, dotted_key: str, config_key: str) -> list:
        """Values of a column, or of a field inside dict columns (`extra_info.answer`), one per row."""
        top, *path = dotted_key.split(".")
        if top not in self.table.column_names:
            from verlx.utils.registry import did_you_mean

            raise KeyError(
                f"{config_key}={dotted_key!r}: column {top!r} is not in {self.files}; columns: "
                f"{self.table.column_names}.{did_you_mean(top, self.table.column_names)}"
            )
        values = self.table.column(top).to_pylist()
        for depth, part in enumerate(path):
            for row, value in enumerate(values):
                if not isinstance(value, dict) or part not in value:
                    where = ".".join([top, *path[:depth]])
                    keys = sorted(value) if isinstance(value, dict) else type(value).__name__
                    raise KeyError(
                        f"{config_key}={dotted_key!r}: {self.locate(row)} has no {part!r} under {where!r} "
                        f"(found {keys})"
                    )
            values = [value[part] for value in values]
        return values


def read_parquet_rows(files: str | list[str], max_samples: int = -1,
                      config_key: str = "data.train_files") -> ParquetRows:
    """Concatenate parquet files (first `max_samples` rows when > 0); a missing file names the key to fix."""
    import pyarrow as pa

    from verlx.data.parquet import read_parquet_table

    files = [files] if isinstance(files, str) else list(files)
    if not files:
        raise ValueError(f"{config_key} is empty: give one or more parquet files")
    tables, starts, total = [], [], 0
    for name in files:
        path = expand_path(name, absolute=True)
        if not os.path.isfile(path):
            raise DataError(f"{config_key}: {path} does not exist "
                            "(write it first, e.g. with examples/data_preprocess)")
        table = read_parquet_table(path)
        tables.append(table)
        starts.append(total)
        total += table.num_rows
    table = pa.concat_tables(tables, promote_options="default") if len(tables) > 1 else tables[0]
    if max_samples > 0:
        table = table.slice(0, max_samples)
    if table.num_rows == 0:
        raise DataError(f"{config_key}: {files} hold no rows")
    return ParquetRows(table, [expand_path(f, absolute=True) for f in files], starts)


def render_prompts(rows: ParquetRows, tokenizer, prompt_key: str, chat_kwargs: dict,
                   config_key: str = "data.prompt_key") -> list[str]:
    """Prompt text after the chat template (with the assistant generation prompt), one per row."""
    texts = []
    for row, value in enumerate(rows.column(prompt_key, config_key)):
        messages = [{"role": "user", "content": value}] if isinstance(value, str) else value
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
            raise ValueError(
                f"{config_key}={prompt_key!r}: {rows.locate(row)} is {value!r}; expected a string or a list of "
                f"{{'role', 'content'}} messages"
            )
        texts.append(tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **chat_kwargs))
    return texts


@dataclass
class TokenizedSFT:
    """Right-padded token ids of each row, with its lengths (host arrays). A prompt-response row's loss tokens are
    those after its prompt; a conversation's (sft_conversations.py) are marked one by one in `loss_mask`."""

    input_ids: np.ndarray  # [rows, longest] int64, padded with pad_id
    lengths: np.ndarray  # [rows] tokens in the row
    prompt_lengths: np.ndarray  # [rows] tokens before the first loss token
    pad_id: int
    loss_mask: np.ndarray | None = None  # [rows, longest] bool: the tokens that carry loss (None: after the prompt)

    def __len__(self) -> int:
        return len(self.lengths)

    @property
    def response_lengths(self) -> np.ndarray:
        """Loss tokens per row."""
        if self.loss_mask is not None:
            return self.loss_mask.sum(axis=1).astype(np.int64)
        return self.lengths - self.prompt_lengths

    def loss_tokens(self, indices: np.ndarray, width: int) -> np.ndarray:
        """[len(indices), width] bool: which tokens of these rows carry loss."""
        if self.loss_mask is not None:
            return self.loss_mask[indices, :width]
        t = np.arange(width)
        return (t[None, :] >= self.prompt_lengths[indices, None]) & (t[None, :] < self.lengths[indices, None])


def tokenize_sft(
    rows: ParquetRows,
    tokenizer,
    *,
    prompt_key: str,
    response_key: str,
    end_of_response_id: int,
    max_length: int,
    truncation: str = "error",
    chat_kwargs: dict | None = None,
) -> TokenizedSFT:
    prompts = render_prompts(rows, tokenizer, prompt_key, chat_kwargs or {})
    responses = [str(v) for v in rows.column(response_key, "data.response_key")]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    response_ids = tokenizer(responses, add_special_tokens=False)["input_ids"]
    prompt_lengths = np.array([len(p) for p in prompt_ids], dtype=np.int64)
    lengths = prompt_lengths + np.array([len(r) + 1 for r in response_ids], dtype=np.int64)
    too_long = np.flatnonzero(lengths > max_length)
    if len(too_long) and truncation == "error":
        row = int(too_long[0])
        raise ValueError(
            f"{len(too_long)} row(s) exceed data.max_length={max_length} tokens, e.g. {rows.locate(row)} with "
            f"{lengths[row]} tokens; raise data.max_length or set data.truncation=left|right"
        )
    if truncation not in TRUNCATIONS:
        raise ValueError(f"data.truncation={truncation!r} is not one of {list(TRUNCATIONS)}")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_of_response_id
    stored = np.minimum(lengths, max_length)
    input_ids = np.full((len(prompts), int(stored.max())), pad_id, dtype=np.int64)
    for row, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        ids = p + r + [end_of_response_id]
        cut = len(ids) - max_length
        if cut > 0 and truncation == "left":
            ids = ids[cut:]
            prompt_lengths[row] = max(0, prompt_lengths[row] - cut)
        elif cut > 0:
            ids = ids[:max_length]
            prompt_lengths[row] = min(prompt_lengths[row], max_length)
        input_ids[row, : len(ids)] = ids
    return TokenizedSFT(input_ids, stored, prompt_lengths, pad_id)


def collate(data: TokenizedSFT, indices: np.ndarray, device: torch.device) -> dict[str, torch.Tensor]:
    """A right-padded micro-batch plus the flat positions whose next token carries loss (the loss targets).

    Position t predicts token t+1, so a prompt-response row with prompt length P and length L contributes positions
    P-1 .. L-2; `response_positions` index the flattened [batch * width] hidden states.
    """
    lengths = data.lengths[indices]
    width = int(lengths.max())
    ids = data.input_ids[indices, :width]
    t = np.arange(width)
    target_mask = np.zeros(ids.shape, dtype=bool)
    target_mask[:, :-1] = data.loss_tokens(indices, width)[:, 1:]
    positions = np.flatnonzero(target_mask)
    targets = ids.reshape(-1)[positions + 1]
    batch = {
        "input_ids": torch.from_numpy(ids),
        "position_ids": torch.from_numpy(np.broadcast_to(t, ids.shape).copy()),
        "response_positions": torch.from_numpy(positions),
        "targets": torch.from_numpy(targets),
    }
    if (lengths != width).any():
        batch["attention_mask"] = torch.from_numpy((t[None, :] < lengths[:, None]).astype(np.int64))
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def collate_packed(data: TokenizedSFT, indices: np.ndarray, device: torch.device, sp_rank: int = 0,
                   sp_size: int = 1) -> dict[str, torch.Tensor]:
    """The micro-batch's real tokens as one packed row, padded to a multiple of `sp_size`, and this SP rank's
    slice of it (Ulysses); `response_positions` index that slice: the loss tokens predicted from it, so the SP
    ranks' losses sum to the micro-batch's. `cu_seqlens` marks the rows (and the padding tail) for varlen
    attention."""
    lengths = data.lengths[indices]
    width = int(lengths.max())
    real = data.input_ids[indices, :width][np.arange(width)[None, :] < lengths[:, None]]
    loss = data.loss_tokens(indices, width)[np.arange(width)[None, :] < lengths[:, None]]
    total = -(-len(real) // sp_size) * sp_size
    tail = total - len(real)
    ids = np.concatenate([real, np.full(tail, data.pad_id, dtype=np.int64)])
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    positions = np.concatenate([np.arange(len(real)) - starts, np.arange(tail)])
    seq_lens = [*lengths.tolist(), *([tail] if tail else [])]
    cu_seqlens = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.tensor(seq_lens).cumsum(0)
    is_target = np.zeros(total, dtype=bool)
    is_target[: len(real) - 1] = loss[1:]
    is_target[np.cumsum(lengths) - 1] = False  # a row's last token predicts nothing of that row
    local = total // sp_size
    piece = slice(sp_rank * local, (sp_rank + 1) * local)
    response_positions = np.flatnonzero(is_target[piece])
    batch = {
        "input_ids": torch.from_numpy(ids[piece][None].copy()),
        "position_ids": torch.from_numpy(positions[piece][None].copy()),
        "response_positions": torch.from_numpy(response_positions),
        "targets": torch.from_numpy(ids[piece.start + response_positions + 1]),
        "cu_seqlens": cu_seqlens,
    }
    out = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
    out["cu_seqlens_host"] = cu_seqlens
    return out
