"""RLHFDataset: prompts from parquet files (veRL schema), chat-templated and tokenised once at load time.

A row of the files: `prompt` (data.prompt_key: a list of {role, content} messages), `data_source`
(data.reward_fn_key), `reward_model` ({"style", "ground_truth"}), `extra_info` (dict), `ability`, and any other
columns, which are passed through. All prompts are rendered and tokenised in one batched call at load (fast
tokenizers encode batches in Rust), stored as one flat token array, and left-padded per batch on the fly.

With a vision-language model's processor, a row's images (data.image_key) go where its `<image>` placeholders are
(data/vision_prompts.py); a batch then carries their pixels in `multi_modal_inputs` and M-RoPE position_ids
[B, 4, T] (models/mrope.py).
"""

from __future__ import annotations

import collections
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from typing import Any

import numpy as np
import torch

from verlx.batch_columns import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS
from verlx.config.loader import DataError
from verlx.config.run import DataConfig
from verlx.data.parquet import read_parquet_columns
from verlx.data.vision_prompts import (
    as_image_prompts,
    checked_row_images,
    checked_vision_inputs,
    decode_image,
    expand_image_tokens,
    row_images,
)
from verlx.models.mrope import batch_position_ids
from verlx.protocol import DataProto
from verlx.utils.paths import expand_path
from verlx.utils.registry import Registry

logger = logging.getLogger(__name__)

# Keep `max_length` tokens of a too-long prompt: which ones is the truncation mode (data.truncation).
PROMPT_TRUNCATIONS: Registry[Callable[[list[int], int], list[int]]] = Registry("prompt truncation", "data.truncation")
PROMPT_TRUNCATIONS.register("left")(lambda ids, n: ids[len(ids) - n :])
PROMPT_TRUNCATIONS.register("right")(lambda ids, n: ids[:n])
PROMPT_TRUNCATIONS.register("middle")(lambda ids, n: ids[: n // 2] + ids[len(ids) - (n - n // 2) :])

# Columns every row has (filled with these when a file lacks them), besides prompt and reward_fn_key.
_DEFAULT_COLUMNS = {"reward_model": dict, "extra_info": dict, "ability": lambda: None}


@dataclass
class SkippedRow:
    file: str
    row: int
    reason: str


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def prompt_problem(prompt: Any) -> tuple[str, str] | None:
    """(kind, detail) of what is wrong with a prompt, or None when it is a usable chat."""
    if not isinstance(prompt, (list, tuple)) or len(prompt) == 0:
        return "malformed prompt", f"expected a non-empty list of {{role, content}} messages, got {_describe(prompt)}"
    for j, message in enumerate(prompt):
        if not (
            isinstance(message, dict)
            and isinstance(message.get("role"), str)
            and isinstance(message.get("content"), str)
        ):
            return (
                "malformed prompt",
                f"message {j} is not a {{'role': str, 'content': str}} dict: {_describe(message)}",
            )
    if all(not message["content"].strip() for message in prompt):
        return "whitespace-only prompt", "every message of the prompt is empty or whitespace"
    return None


def render_and_tokenize(tokenizer, conversations: list, template_kwargs: dict) -> tuple[list[str], list[list[int]]]:
    """Chat template (with the generation prompt) and token ids of each conversation, in one batched call each."""
    if not conversations:
        return [], []
    texts = tokenizer.apply_chat_template(conversations, add_generation_prompt=True, tokenize=False, **template_kwargs)
    return texts, tokenizer(texts, add_special_tokens=False)["input_ids"]


def prompt_pad_token_id(tokenizer) -> int:
    """The token prompts are left-padded with: the pad token, else eos."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has neither a pad token nor an eos token to left-pad prompts with")
    return int(tokenizer.eos_token_id)


class RLHFDataset:
    """Tokenised prompts of one or more parquet files; `dataset[i]` is a row dict, `get_batch(ids)` a DataProto."""

    def __init__(self, data_files: str | Sequence[str], tokenizer, config: DataConfig, max_samples: int = -1, *,
                 processor=None):
        """veRL's constructor: `data_files`, `tokenizer`, `config` (the data section), `max_samples`; `processor`:
        a vision-language model's (data/vision_prompts.py), None for a text model."""
        self.images = as_image_prompts(processor, tokenizer) if processor is not None else None
        files = data_files
        self.files = [expand_path(f) for f in ([files] if isinstance(files, (str, os.PathLike)) else files)]
        self.tokenizer = tokenizer
        self.config = config
        self.max_prompt_length = int(config.max_prompt_length)
        if config.truncation != "error" and config.truncation not in PROMPT_TRUNCATIONS:
            raise ValueError(
                f"data.truncation must be one of error, {', '.join(PROMPT_TRUNCATIONS.names())}; "
                f"got {config.truncation!r}"
            )
        self.pad_token_id = prompt_pad_token_id(tokenizer)
        if not getattr(tokenizer, "chat_template", None):
            raise DataError(
                f"the tokenizer {getattr(tokenizer, 'name_or_path', '')!r} has no chat template, which RLHFDataset "
                "needs to turn the prompt messages into text; use a chat/instruct model's tokenizer (data.tokenizer)"
            )
        self.skipped: list[SkippedRow] = []
        self.num_filtered = 0
        self.truncated_tokens = np.zeros(0, dtype=np.int64)  # tokens cut from each truncated prompt
        self._load(max_samples)

    # ------------------------------------------------------------------ loading
    def _read(self, max_samples: int) -> tuple[dict[str, list], list[tuple[str, int]]]:
        """All columns of all files (concatenated) and each row's (file, row in file)."""
        prompt_key, source_key = self.config.prompt_key, self.config.reward_fn_key
        files: list[tuple[str, dict[str, list], int]] = []
        total = 0
        for path in self.files:
            columns = read_parquet_columns(path)
            for key, config_key in ((prompt_key, "data.prompt_key"), (source_key, "data.reward_fn_key")):
                if key not in columns:
                    raise DataError(
                        f"{path} has no column '{key}' ({config_key}); its columns are {sorted(columns)}. "
                        f"Set {config_key} to the right column or re-create the file (examples/data_preprocess)."
                    )
            files.append((path, columns, len(columns[prompt_key])))
            total += files[-1][2]
            if 0 < max_samples <= total:
                break
        keys = dict.fromkeys([k for _, columns, _ in files for k in columns] + list(_DEFAULT_COLUMNS))
        merged: dict[str, list] = {k: [] for k in keys}
        origins: list[tuple[str, int]] = []
        for path, columns, n in files:
            for key in keys:
                default = _DEFAULT_COLUMNS.get(key, lambda: None)
                merged[key].extend(columns[key] if key in columns else [default() for _ in range(n)])
            origins.extend((path, r) for r in range(n))
        if max_samples > 0:
            origins = origins[:max_samples]
            merged = {k: v[:max_samples] for k, v in merged.items()}
        return merged, origins

    def _load(self, max_samples: int) -> None:
        columns, origins = self._read(max_samples)
        prompts = columns[self.config.prompt_key]
        good = []
        for i, prompt in enumerate(prompts):
            problem = prompt_problem(prompt)
            if problem is None:
                good.append(i)
                continue
            kind, detail = problem
            file, row = origins[i]
            if not self.config.skip_bad_rows:
                raise DataError(
                    f"{file} row {row}: {kind} in column '{self.config.prompt_key}': {detail}. Fix the row, or set "
                    "data.skip_bad_rows=true to skip such rows (they are counted and reported)."
                )
            self.skipped.append(SkippedRow(file, row, f"{kind}: {detail}"))
        conversations = [prompts[i] for i in good]
        image_counts = self._image_conversations(columns, good, origins, conversations)
        texts, ids = self._tokenize(conversations)
        if image_counts is not None:
            token = self.images.model.image_token_id
            ids = [expand_image_tokens(x, counts, token, self._where(origins[i]))
                   for x, counts, i in zip(ids, image_counts, good)]
        good, texts, ids = self._fit_length(good, texts, ids, origins, image_counts)
        if not good:
            raise DataError(
                f"no usable prompts in {self.files}: {self.num_skipped} bad rows skipped, {self.num_filtered} "
                f"longer than data.max_prompt_length={self.max_prompt_length} dropped"
            )
        self._store(columns, good, texts, ids)
        self._origins = [origins[i] for i in good]
        self._report(len(origins))

    def _where(self, origin: tuple[str, int]) -> str:
        return f"{origin[0]} row {origin[1]} (column '{self.config.image_key}', data.image_key)"

    def _image_conversations(self, columns: dict[str, list], good: list[int], origins, conversations: list
                             ) -> list[list[int]] | None:
        """Vision-language model: each row's messages with image parts (in place) and its images' token counts;
        None for a text model, which refuses rows with images."""
        cells = columns.get(self.config.image_key) if self.config.image_key else None
        if self.images is None:
            for i in good if cells is not None else []:
                if row_images(cells[i]):
                    raise DataError(f"{self._where(origins[i])}: the row has images, but the model is not a "
                                    "vision-language model (it has no image processor); use a vision-language model "
                                    "(Qwen2-VL, Qwen2.5-VL, Qwen3-VL) or drop the column")
            return None
        videos = columns.get("videos")
        counts = []
        for j, i in enumerate(good):
            if videos is not None and row_images(videos[i]):
                raise DataError(f"{origins[i][0]} row {origins[i][1]}: column 'videos' has videos; verlx does not "
                                "support video inputs yet")
            conversations[j], sizes = checked_row_images(cells[i] if cells is not None else None, conversations[j],
                                                         self._where(origins[i]))
            counts.append([self.images.tokens_per_image(h, w) for h, w in sizes])
        return counts

    def _tokenize(self, conversations: list) -> tuple[list[str], list[list[int]]]:
        kwargs = dict(self.config.apply_chat_template_kwargs or {})
        workers = int(self.config.filter_overlong_prompts_workers or 1)
        if workers <= 1 or len(conversations) < 2 * workers:
            return render_and_tokenize(self.tokenizer, conversations, kwargs)
        bounds = np.linspace(0, len(conversations), workers + 1).astype(int)
        shards = [conversations[a:b] for a, b in zip(bounds[:-1], bounds[1:])]
        with ProcessPoolExecutor(max_workers=workers, mp_context=get_context("spawn")) as pool:
            parts = list(pool.map(render_and_tokenize, [self.tokenizer] * workers, shards, [kwargs] * workers))
        return [t for p in parts for t in p[0]], [x for p in parts for x in p[1]]

    def _fit_length(self, good: list[int], texts: list[str], ids: list[list[int]], origins, image_counts=None):
        """Drop (filter_overlong_prompts), truncate (truncation=left/right/middle) or refuse too-long prompts; a
        prompt with images is never truncated (its image tokens would no longer match its images)."""
        limit = self.max_prompt_length
        lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        over = np.flatnonzero(lengths > limit)
        if len(over) == 0:
            return good, texts, ids
        if self.config.filter_overlong_prompts:
            keep = np.flatnonzero(lengths <= limit)
            self.num_filtered = len(over)
            return [good[i] for i in keep], [texts[i] for i in keep], [ids[i] for i in keep]
        if self.config.truncation == "error":
            file, row = origins[good[over[0]]]
            raise DataError(
                f"{file} row {row}: the prompt is {lengths[over[0]]} tokens, longer than data.max_prompt_length="
                f"{limit} ({len(over)} prompts are). Raise data.max_prompt_length, set data.filter_overlong_prompts="
                "true to drop them, or set data.truncation to left, right or middle."
            )
        with_images = [i for i in over if image_counts is not None and image_counts[i]]
        if with_images:
            file, row = origins[good[with_images[0]]]
            raise DataError(
                f"{file} row {row}: the prompt with images is {lengths[with_images[0]]} tokens, longer than "
                f"data.max_prompt_length={limit}, and truncating it would cut its image tokens; raise "
                "data.max_prompt_length or set data.filter_overlong_prompts=true to drop such prompts."
            )
        truncate = PROMPT_TRUNCATIONS.get(self.config.truncation)
        for i in over:
            ids[i] = truncate(ids[i], limit)
        self.truncated_tokens = lengths[over] - limit
        return good, texts, ids

    def _store(self, columns: dict[str, list], good: list[int], texts: list[str], ids: list[list[int]]) -> None:
        self._lengths = np.fromiter((len(x) for x in ids), dtype=np.int64, count=len(ids))
        self._offsets = np.concatenate([[0], np.cumsum(self._lengths)[:-1]]).astype(np.int64)
        self._flat = np.fromiter((t for row in ids for t in row), dtype=np.int64, count=int(self._lengths.sum()))
        rows = np.asarray(good, dtype=np.int64)
        self._non_tensor: dict[str, np.ndarray] = {}
        image_key = self.config.image_key if self.images is not None else None
        self._images = object_array(columns[image_key])[rows] if image_key in columns else None
        for key, values in columns.items():
            if key not in (self.config.prompt_key, image_key):
                self._non_tensor[key] = object_array(values)[rows]
        self._non_tensor["index"] = rows
        if self.config.return_raw_chat:
            self._non_tensor["raw_prompt"] = object_array(columns[self.config.prompt_key])[rows]
        if self.config.return_full_prompt:
            self._non_tensor["full_prompt"] = object_array(texts)

    def _report(self, num_read: int) -> None:
        changes = []
        if self.num_skipped:
            reasons = ", ".join(f"{n} {kind}" for kind, n in self.skip_reasons.items())
            changes.append(f"{self.num_skipped} bad rows skipped ({reasons})")
        if self.num_filtered:
            changes.append(
                f"{self.num_filtered} prompts longer than data.max_prompt_length={self.max_prompt_length} dropped"
            )
        if self.num_truncated:
            changes.append(
                f"{self.num_truncated} prompts longer than data.max_prompt_length={self.max_prompt_length} cut by "
                f"data.truncation={self.config.truncation} ({int(self.truncated_tokens.sum())} tokens removed in "
                f"all, at most {int(self.truncated_tokens.max())} from one prompt)"
            )
        message = f"RLHFDataset {self.files}: {len(self)} of {num_read} rows kept"
        (logger.warning if changes else logger.info)(message + ("; " + "; ".join(changes) if changes else ""))

    # ------------------------------------------------------------------ reporting
    @property
    def num_skipped(self) -> int:
        return len(self.skipped)

    @property
    def num_truncated(self) -> int:
        return len(self.truncated_tokens)

    @property
    def skip_reasons(self) -> dict[str, int]:
        """How many rows were skipped for each kind of problem."""
        return dict(collections.Counter(s.reason.split(":", 1)[0] for s in self.skipped))

    @property
    def prompt_lengths(self) -> np.ndarray:
        """Token count of every kept prompt (after truncation)."""
        return self._lengths.copy()

    def origin(self, i: int) -> tuple[str, int]:
        """(file, row in that file) of kept row `i`, for messages about a row."""
        return self._origins[i]

    def column(self, key: str) -> np.ndarray | None:
        """A non-tensor column of the kept rows (e.g. agent_name), None when the files have no such column."""
        values = self._non_tensor.get(key)
        return None if values is None else values.copy()

    # ------------------------------------------------------------------ access
    def __len__(self) -> int:
        return len(self._lengths)

    def get_batch(self, indices: Sequence[int] | np.ndarray | torch.Tensor) -> DataProto:
        """Rows `indices` as one DataProto, left-padded to max_prompt_length (one slice copy per row)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        width = self.max_prompt_length
        input_ids = np.full((len(idx), width), self.pad_token_id, dtype=np.int64)
        attention_mask = np.zeros((len(idx), width), dtype=np.int64)
        position_ids = np.zeros((len(idx), width), dtype=np.int64)
        steps = np.arange(width, dtype=np.int64)
        raw_prompt_ids = []
        for row, (offset, n) in enumerate(zip(self._offsets[idx].tolist(), self._lengths[idx].tolist())):
            tokens = self._flat[offset : offset + n]
            input_ids[row, width - n :] = tokens
            attention_mask[row, width - n :] = 1
            position_ids[row, width - n :] = steps[:n]
            raw_prompt_ids.append(tokens.tolist())
        non_tensor = {k: v[idx] for k, v in self._non_tensor.items()}
        non_tensor["raw_prompt_ids"] = object_array(raw_prompt_ids)
        tensors = {k: torch.from_numpy(v) for k, v in
                   {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}.items()}
        if self.images is not None:
            self._add_vision(idx, tensors, non_tensor)
        return DataProto(tensors, non_tensor)

    def _add_vision(self, idx: np.ndarray, tensors: dict[str, torch.Tensor], non_tensor: dict) -> None:
        """The rows' images (multi_modal_data), their pixels (multi_modal_inputs) and M-RoPE position_ids
        [B, 4, T]."""
        cells = self._images[idx] if self._images is not None else [None] * len(idx)
        images = [[decode_image(value) for value in row_images(cell)] for cell in cells]
        inputs = [checked_vision_inputs(self.images, row, tensors["input_ids"][i], self._where(self._origins[origin]))
                  for i, (origin, row) in enumerate(zip(idx.tolist(), images))]
        grids = [x.get("image_grid_thw") for x in inputs]
        model = self.images.model
        tensors["position_ids"] = batch_position_ids(tensors["input_ids"], tensors["attention_mask"], grids,
                                                     model.image_token_id, model.merge_size)
        non_tensor[MULTI_MODAL_INPUTS] = object_array(inputs)
        non_tensor[MULTI_MODAL_DATA] = object_array([{"image": row} if row else {} for row in images])

    def __getitem__(self, i: int) -> dict[str, Any]:
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"row {i} out of range for a dataset of {n} rows")
        batch = self.get_batch([i % n])
        row: dict[str, Any] = {k: v[0] for k, v in batch.batch.items()}
        row.update({k: (int(v[0]) if k == "index" else v[0]) for k, v in batch.non_tensor_batch.items()})
        return row


def object_array(values: Sequence[Any]) -> np.ndarray:
    """A 1-D object array holding exactly these values (np.array would turn nested lists into extra dims)."""
    out = np.empty(len(values), dtype=object)
    for i, value in enumerate(values):
        out[i] = value
    return out
