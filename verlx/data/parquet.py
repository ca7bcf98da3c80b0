"""Parquet in and out (pyarrow): whole-file column reads and atomic writes."""

from __future__ import annotations

import os
import tempfile
from typing import Any, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from verlx.utils.paths import expand_path


def write_parquet_atomic(rows: Sequence[dict[str, Any]] | pa.Table, path: str | os.PathLike) -> str:
    """Write rows to `path` through a temporary file in the same directory and a rename, so a reader never
    sees half a file. Returns the absolute path."""
    path = expand_path(path, absolute=True)
    directory = os.path.dirname(path)
    os.makedirs(directory, exist_ok=True)
    table = rows if isinstance(rows, pa.Table) else pa.Table.from_pylist(list(rows))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".parquet")
    os.close(fd)
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def read_parquet_columns(path: str) -> dict[str, list]:
    """Every column of a parquet file as Python lists (structs become dicts), pandas index columns dropped."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"parquet file not found: {path} (check data.train_files / data.val_files)")
    table = pq.read_table(path)
    return {
        name: table.column(name).to_pylist() for name in table.column_names if not name.startswith("__index_level_")
    }
