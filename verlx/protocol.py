"""DataProto: the batch that travels between the driver and the workers.

A batch is three things that share a row count: named tensors (`batch`), numpy object arrays
(`non_tensor_batch`, for strings, dicts and other per-row Python values) and a free `meta_info` dict.
Every phase of the PPO step takes one and returns one, so the operations here (split for data parallel,
concat the results, repeat for n samples) must be exact and cheap.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

__all__ = ["DataProto", "DataProtoItem", "pad_dataproto_to_divisor", "unpad_dataproto"]

# numpy has no bfloat16: tensors of these dtypes travel as integer views of the same bytes.
_NUMPY_VIEW_DTYPES = {torch.bfloat16: torch.int16, torch.float8_e4m3fn: torch.uint8, torch.float8_e5m2: torch.uint8}


def _as_row_array(values: Any) -> np.ndarray:
    """Per-row values as a numpy array: numpy arrays are kept, anything else becomes a 1-D object array
    whose elements are exactly the given values (np.array would split nested lists into extra dims)."""
    if isinstance(values, np.ndarray) and values.ndim >= 1:
        return values
    values = list(values)
    out = np.empty(len(values), dtype=object)
    for i, v in enumerate(values):
        out[i] = v
    return out


def _normalise_index(index: Any, length: int) -> slice | torch.Tensor:
    """Turn a slice / list / numpy / tensor index (ints or bools) into a slice or a long tensor."""
    if isinstance(index, slice):
        return index
    if isinstance(index, np.ndarray):
        index = torch.from_numpy(index)
    elif isinstance(index, (list, tuple, range)):
        index = torch.as_tensor(list(index))
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"DataProto index must be int, slice, list, numpy array or tensor, got {type(index).__name__}")
    if index.dtype == torch.bool:
        if index.numel() != length:
            raise IndexError(f"boolean index has {index.numel()} entries for a DataProto of {length} rows")
        index = index.nonzero(as_tuple=True)[0]
    if index.numel() == 0:
        return index.to(torch.long).reshape(0)
    index = index.to(torch.long).reshape(-1)
    if int(index.max()) >= length or int(index.min()) < -length:
        raise IndexError(f"index out of range for a DataProto of {length} rows")
    return index


@dataclass
class DataProtoItem:
    """One row: what reward functions and per-sample code look at."""

    batch: dict[str, torch.Tensor] = field(default_factory=dict)
    non_tensor_batch: dict[str, Any] = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


class DataProto:
    """Named tensors and numpy object arrays sharing dim 0, plus meta_info."""

    __slots__ = ("batch", "non_tensor_batch", "meta_info")

    def __init__(
        self,
        batch: dict[str, torch.Tensor] | None = None,
        non_tensor_batch: dict[str, Any] | None = None,
        meta_info: dict | None = None,
    ):
        self.batch: dict[str, torch.Tensor] = dict(batch or {})
        self.non_tensor_batch: dict[str, np.ndarray] = {
            k: _as_row_array(v) for k, v in (non_tensor_batch or {}).items()
        }
        self.meta_info: dict = dict(meta_info or {})
        self.check_consistency()

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_dict(cls, tensors: dict | None = None, non_tensors: dict | None = None, meta_info: dict | None = None):
        return cls(tensors, non_tensors, meta_info)

    @classmethod
    def from_single_dict(cls, data: dict[str, Any], meta_info: dict | None = None) -> DataProto:
        """Split one dict into tensors and per-row Python values by the type of each value."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        non_tensors = {k: v for k, v in data.items() if not isinstance(v, torch.Tensor)}
        return cls(tensors, non_tensors, meta_info)

    def check_consistency(self) -> None:
        lengths = {f"batch['{k}']": v.shape[0] if v.dim() > 0 else None for k, v in self.batch.items()}
        lengths.update({f"non_tensor_batch['{k}']": len(v) for k, v in self.non_tensor_batch.items()})
        for name, n in lengths.items():
            if n is None:
                raise ValueError(f"DataProto {name} is a 0-dim tensor; every tensor needs a batch dimension")
        distinct = set(lengths.values())
        if len(distinct) > 1:
            detail = ", ".join(f"{k}={v}" for k, v in lengths.items())
            raise ValueError(f"DataProto fields disagree on the number of rows: {detail}")

    # ------------------------------------------------------------------ basics
    def __len__(self) -> int:
        for v in self.batch.values():
            return v.shape[0]
        for v in self.non_tensor_batch.values():
            return len(v)
        return 0

    def __repr__(self) -> str:
        tensors = ", ".join(f"{k}: {tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}"
                            for k, v in self.batch.items())
        return (
            f"DataProto(len={len(self)}, batch={{{tensors}}}, non_tensor_batch={list(self.non_tensor_batch)}, "
            f"meta_info={list(self.meta_info)})"
        )

    def keys(self) -> list[str]:
        return list(self.batch) + list(self.non_tensor_batch)

    def __getitem__(self, index):
        if isinstance(index, (int, np.integer)):
            n = len(self)
            i = int(index)
            if not -n <= i < n:
                raise IndexError(f"row {i} out of range for a DataProto of {n} rows")
            return DataProtoItem(
                {k: v[i] for k, v in self.batch.items()},
                {k: v[i] for k, v in self.non_tensor_batch.items()},
                self.meta_info,
            )
        idx = _normalise_index(index, len(self))
        np_idx = idx if isinstance(idx, slice) else idx.numpy()
        return DataProto(
            {k: v[idx] for k, v in self.batch.items()},
            {k: v[np_idx] for k, v in self.non_tensor_batch.items()},
            self.meta_info,
        )

    def __iter__(self):
        for i in range(len(self)):
            yield self[i]

    def __getstate__(self):
        """Tensors become numpy arrays so Ray ships them as out-of-band buffers, not per-row objects."""
        packed = {}
        for k, v in self.batch.items():
            v = v.detach().cpu().contiguous()
            view = _NUMPY_VIEW_DTYPES.get(v.dtype)
            packed[k] = (str(v.dtype), (v.view(view) if view is not None else v).numpy())
        return packed, self.non_tensor_batch, self.meta_info

    def __setstate__(self, state):
        packed, non_tensor_batch, meta_info = state
        batch = {}
        for k, (dtype_name, array) in packed.items():
            # Ray hands back read-only views of its object store: copy once so the tensor may be written.
            t = torch.from_numpy(array if array.flags.writeable else array.copy())
            dtype = getattr(torch, dtype_name.removeprefix("torch."))
            batch[k] = t.view(dtype) if dtype in _NUMPY_VIEW_DTYPES else t
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info

    # ------------------------------------------------------------------ selection
    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None, deepcopy: bool = False):
        """A view with only the named keys (None keeps everything of that kind)."""
        batch = self._pick(self.batch, batch_keys, "batch")
        non_tensor = self._pick(self.non_tensor_batch, non_tensor_batch_keys, "non_tensor_batch")
        meta = self._pick(self.meta_info, meta_info_keys, "meta_info")
        if deepcopy:
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return DataProto(batch, non_tensor, meta)

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> DataProto:
        """Remove the named keys from this batch and return them as a new DataProto."""
        out = self.select(batch_keys or [], non_tensor_batch_keys or [], meta_info_keys or [])
        for k in out.batch:
            del self.batch[k]
        for k in out.non_tensor_batch:
            del self.non_tensor_batch[k]
        for k in out.meta_info:
            del self.meta_info[k]
        return out

    @staticmethod
    def _pick(source: dict, keys, what: str) -> dict:
        if keys is None:
            return dict(source)
        missing = [k for k in keys if k not in source]
        if missing:
            raise KeyError(f"DataProto has no {what} key(s) {missing}; present: {sorted(source)}")
        return {k: source[k] for k in keys}

    def rename(self, old_keys: str | Sequence[str], new_keys: str | Sequence[str]) -> DataProto:
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys)
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys)
        for old, new in zip(old_keys, new_keys, strict=True):
            self.batch[new] = self.batch.pop(old)
        return self

    def union(self, other: DataProto) -> DataProto:
        """Merge `other` into this batch in place. Same key with different values is an error."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"cannot union DataProtos of {len(self)} and {len(other)} rows")
        for k, v in other.batch.items():
            if k in self.batch and not (self.batch[k] is v or torch.equal(self.batch[k], v)):
                raise ValueError(f"union conflict: batch key '{k}' differs between the two DataProtos")
            self.batch[k] = v
        for k, v in other.non_tensor_batch.items():
            if k in self.non_tensor_batch and not _object_arrays_equal(self.non_tensor_batch[k], v):
                raise ValueError(f"union conflict: non_tensor_batch key '{k}' differs between the two DataProtos")
            self.non_tensor_batch[k] = v
        for k, v in other.meta_info.items():
            if k in self.meta_info and not _values_equal(self.meta_info[k], v):
                raise ValueError(f"union conflict: meta_info key '{k}' is {self.meta_info[k]!r} here, {v!r} there")
            self.meta_info[k] = v
        return self

    # ------------------------------------------------------------------ reshaping
    def chunk(self, chunks: int) -> list[DataProto]:
        """Split into `chunks` equal parts (pad first with pad_to_divisor when the length does not divide)."""
        n = len(self)
        if chunks <= 0 or n % chunks:
            raise ValueError(
                f"cannot chunk a DataProto of {n} rows into {chunks} equal parts; "
                f"use pad_to_divisor({chunks}) first or pick a divisor of {n}"
            )
        return self.split(n // chunks)

    def split(self, split_size: int) -> list[DataProto]:
        """Consecutive parts of `split_size` rows (the last may be shorter)."""
        if split_size <= 0:
            raise ValueError(f"split_size must be positive, got {split_size}")
        return [self[i : i + split_size] for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: Sequence[DataProto]) -> DataProto:
        """Rows of every part in order; meta_info is the first part's (with differing values an error)."""
        if not data:
            raise ValueError("DataProto.concat needs at least one DataProto")
        keys = set(data[0].batch), set(data[0].non_tensor_batch)
        for i, d in enumerate(data[1:], 1):
            if (set(d.batch), set(d.non_tensor_batch)) != keys:
                raise ValueError(
                    f"DataProto.concat: part {i} has keys {sorted(d.keys())}, part 0 has {sorted(data[0].keys())}"
                )
        batch = {k: torch.cat([d.batch[k] for d in data]) for k in data[0].batch}
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data]) for k in data[0].non_tensor_batch}
        meta: dict = {}
        for d in data:
            for k, v in d.meta_info.items():
                meta.setdefault(k, v)
        return DataProto(batch, non_tensor, meta)

    def repeat(self, repeat_times: int, interleave: bool = True) -> DataProto:
        """Each row `repeat_times` times: [a,a,b,b] when interleaved, [a,b,a,b] otherwise."""
        if repeat_times < 1:
            raise ValueError(f"repeat_times must be >= 1, got {repeat_times}")
        n = len(self)
        if interleave:
            index = torch.arange(n).repeat_interleave(repeat_times)
        else:
            index = torch.arange(n).repeat(repeat_times)
        return self[index]

    def reorder(self, indices: torch.Tensor | np.ndarray | Sequence[int]) -> None:
        """Permute the rows in place (used to balance sequence lengths across ranks)."""
        reordered = self[indices]
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def pad_to_divisor(self, divisor: int) -> tuple[DataProto, int]:
        """Append rows copied from the start until the length divides `divisor`; returns (padded, pad_size)."""
        n = len(self)
        if n == 0:
            raise ValueError("cannot pad an empty DataProto")
        pad = (-n) % divisor
        if pad == 0:
            return self, 0
        index = torch.cat([torch.arange(n), torch.arange(pad) % n])
        return self[index], pad

    def unpad(self, pad_size: int) -> DataProto:
        return self if pad_size == 0 else self[: len(self) - pad_size]

    # ------------------------------------------------------------------ devices and disk
    def to(self, device: torch.device | str, non_blocking: bool = False) -> DataProto:
        return DataProto(
            {k: v.to(device, non_blocking=non_blocking) for k, v in self.batch.items()},
            self.non_tensor_batch,
            self.meta_info,
        )

    def save(self, path: str | os.PathLike) -> None:
        """Written to a temporary file and renamed, so a crash never leaves half a file."""
        path = os.fspath(path)
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".pt")
        try:
            with os.fdopen(fd, "wb") as f:
                torch.save(
                    {"batch": self.batch, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}, f
                )
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> DataProto:
        state = torch.load(os.fspath(path), map_location="cpu", weights_only=False)
        return cls(state["batch"], state["non_tensor_batch"], state["meta_info"])


def _values_equal(a: Any, b: Any) -> bool:
    """Equal by value, containers of tensors included (a row's `multi_modal_inputs` dict after a Ray round trip is
    a new object holding equal tensors)."""
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return bool(np.array_equal(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_values_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))
    try:
        return bool(a == b)
    except Exception:
        return a is b


def _object_arrays_equal(a: np.ndarray, b: np.ndarray) -> bool:
    if a is b:
        return True
    if a.dtype != object and b.dtype != object:
        return bool(np.array_equal(a, b))
    return len(a) == len(b) and all(_values_equal(x, y) for x, y in zip(a, b))


def pad_dataproto_to_divisor(data: DataProto, divisor: int) -> tuple[DataProto, int]:
    return data.pad_to_divisor(divisor)


def unpad_dataproto(data: DataProto, pad_size: int) -> DataProto:
    return data.unpad(pad_size)


def collate_rows(rows: Iterable[dict[str, Any]]) -> DataProto:
    """Stack per-row dicts (tensors stacked, anything else into object arrays) into one DataProto."""
    rows = list(rows)
    if not rows:
        raise ValueError("collate_rows needs at least one row")
    tensors = {k: torch.stack([r[k] for r in rows]) for k, v in rows[0].items() if isinstance(v, torch.Tensor)}
    others = {k: [r[k] for r in rows] for k, v in rows[0].items() if not isinstance(v, torch.Tensor)}
    return DataProto(tensors, others)
