"""Multi-turn SFT data (veRL's messages rows): each row is a conversation, and every assistant message carries loss.

A conversation goes through the tokenizer's chat template once, with the row's tools and enable_thinking flag. The
tokens of assistant message i are found by rendering the conversation up to message i with the generation prompt
(where the reply starts) and up to message i inclusive (where it ends, end-of-turn tokens included, as veRL trains
them). Both renderings must be prefixes of the whole conversation's tokens; a template that renders earlier turns
differently once later ones follow (one that drops earlier reasoning, say) is refused naming the row, since its
tokens would not be what the model sees at inference.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from verlx.config.loader import DataError
from verlx.data.sft_dataset import ParquetRows, TokenizedSFT


@dataclass(frozen=True)
class ConversationKeys:
    """Where a row's conversation, tools and thinking flag are (veRL's data.multiturn keys)."""

    messages_key: str = "messages"
    tools_key: str = "tools"
    enable_thinking_key: str = "enable_thinking"
    enable_thinking_default: bool | None = None


def _tools(value: Any) -> list | None:
    if value is None:
        return None
    tools = json.loads(value) if isinstance(value, str) else value
    return list(tools) if tools else None


def _messages(value: Any, where: str, key: str) -> list[dict]:
    messages = value
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            messages = json.loads(value)
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise DataError(f"data.multiturn.messages_key={key!r}: {where} is {str(value)[:120]!r}; expected a list of "
                        "{'role', 'content'} messages")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"data.multiturn.messages_key={key!r}: {where} has no assistant message, so nothing to train "
                        "on")
    return [{k: v for k, v in m.items() if v is not None} for m in messages]


class _Renderer:
    def __init__(self, tokenizer, chat_kwargs: dict):
        self.tokenizer, self.chat_kwargs = tokenizer, chat_kwargs

    def ids(self, messages: list[dict], generation_prompt: bool, tools, thinking) -> list[int]:
        kwargs = dict(self.chat_kwargs)
        if thinking is not None:
            kwargs["enable_thinking"] = thinking
        text = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=generation_prompt,
                                                  tokenize=False, **kwargs)
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def conversation_tokens(messages: list[dict], renderer: _Renderer, tools, thinking, where: str
                        ) -> tuple[list[int], np.ndarray]:
    """The conversation's token ids and which of them carry loss (the assistant messages')."""
    full = renderer.ids(messages, False, tools, thinking)
    loss = np.zeros(len(full), dtype=bool)
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = renderer.ids(messages[:i], True, tools, thinking) if i else []
        end = renderer.ids(messages[: i + 1], False, tools, thinking)
        for prefix in (start, end):
            if full[: len(prefix)] != prefix:
                raise DataError(f"{where}: the chat template renders the conversation up to message {i} differently "
                                "from the whole conversation (a template that rewrites earlier turns, e.g. dropping "
                                "their reasoning), so the assistant tokens cannot be located; train on conversations "
                                "the template renders turn by turn, or split them into one row per assistant turn")
        loss[len(start) : len(end)] = True
    return full, loss


def tokenize_conversations(rows: ParquetRows, tokenizer, keys: ConversationKeys, *, max_length: int,
                           truncation: str = "error", chat_kwargs: dict | None = None) -> TokenizedSFT:
    """Every row's conversation tokenized, loss on its assistant messages, cut to max_length by `truncation`."""
    columns = rows.table.column_names
    conversations = rows.column(keys.messages_key, "data.multiturn.messages_key")
    tools = rows.column(keys.tools_key, "data.multiturn.tools_key") if keys.tools_key in columns else None
    thinking = (rows.column(keys.enable_thinking_key, "data.multiturn.enable_thinking_key")
                if keys.enable_thinking_key in columns else None)
    renderer = _Renderer(tokenizer, chat_kwargs or {})
    ids, masks = [], []
    for row, value in enumerate(conversations):
        where = rows.locate(row)
        flag = keys.enable_thinking_default if thinking is None or thinking[row] is None else bool(thinking[row])
        row_ids, row_loss = conversation_tokens(_messages(value, where, keys.messages_key), renderer,
                                                _tools(tools[row]) if tools else None, flag, where)
        ids.append(row_ids)
        masks.append(row_loss)
    return _pad(ids, masks, rows, tokenizer, max_length, truncation)


def _pad(ids: list[list[int]], masks: list[np.ndarray], rows: ParquetRows, tokenizer, max_length: int,
         truncation: str) -> TokenizedSFT:
    lengths = np.array([len(r) for r in ids], dtype=np.int64)
    too_long = np.flatnonzero(lengths > max_length)
    if len(too_long) and truncation == "error":
        row = int(too_long[0])
        raise DataError(f"{len(too_long)} conversation(s) exceed data.max_length={max_length} tokens, e.g. "
                        f"{rows.locate(row)} with {lengths[row]} tokens; raise data.max_length or set "
                        "data.truncation=left|right")
    stored = np.minimum(lengths, max_length)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = np.full((len(ids), int(stored.max())), pad_id, dtype=np.int64)
    loss_mask = np.zeros(input_ids.shape, dtype=bool)
    for row, (row_ids, row_loss) in enumerate(zip(ids, masks)):
        keep = slice(len(row_ids) - stored[row], None) if truncation == "left" else slice(0, stored[row])
        input_ids[row, : stored[row]] = row_ids[keep]
        loss_mask[row, : stored[row]] = row_loss[keep]
    firsts = np.where(loss_mask.any(axis=1), loss_mask.argmax(axis=1), stored)
    return TokenizedSFT(input_ids, stored, firsts.astype(np.int64), int(pad_id), loss_mask)
