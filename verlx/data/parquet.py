"""Parquet in and out (pyarrow): whole-file reads whose errors name the file and the damage, and atomic writes."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from verlx.config.loader import DataError
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
    table = read_parquet_table(path)
    return {
        name: table.column(name).to_pylist() for name in table.column_names if not name.startswith("__index_level_")
    }


def read_parquet_table(path: str, columns: Sequence[str] | None = None) -> pa.Table:
    """pq.read_table, with errors (DataError) that name the file, the damaged rows and column, and what to do."""
    path = expand_path(path)
    if not os.path.isfile(path):
        raise DataError(f"parquet file not found: {path} (check data.train_files / data.val_files)")
    try:
        if columns is not None:
            present = pq.read_schema(path).names
            missing = [c for c in columns if c not in present]
            if missing:
                raise DataError(f"{path} has no column {', '.join(map(repr, missing))}; its columns are {present}")
        return pq.read_table(path, columns=columns)
    except (pa.ArrowException, OSError) as e:
        raise DataError(unreadable_parquet_message(path, e)) from None


def unreadable_parquet_message(path: str, error: Exception) -> str:
    """Why pyarrow could not read `path` (JSON given as parquet, not parquet at all, or damaged where) and the fix."""
    with open(path, "rb") as f:
        head = f.read(64)
    detail = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    if head.lstrip()[:1] in (b"{", b"["):
        return (f"{path} is not a parquet file: it starts with {head.lstrip()[:1].decode()!r} like JSON or JSON Lines. "
                "verlx reads parquet files in veRL's schema (prompt, data_source, reward_model, ...): convert it with "
                "a script in examples/data_preprocess/ (e.g. gsm8k.py --local_dataset_path FILE), or write the rows "
                "with pandas.DataFrame.to_parquet / datasets.Dataset.to_parquet and pass the .parquet file")
    if not head.startswith(b"PAR1"):
        return (f"{path} is not a parquet file (it does not begin with parquet's magic bytes PAR1; pyarrow: "
                f"{detail}); pass the .parquet file written by a script in examples/data_preprocess/")
    return (f"{path} is damaged{_damaged_part(path)} (pyarrow: {detail}); write it again with the script that made it "
            "(examples/data_preprocess/) or copy it again from its source")


def _damaged_part(path: str) -> str:
    """Where in a parquet file reading fails: the footer, or the rows and column of the first unreadable page."""
    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowException, OSError):
        return " (its footer, which holds the schema and the row index, cannot be read: a truncated or partial copy?)"
    first_row = 0
    for group in range(parquet.num_row_groups):
        rows = parquet.metadata.row_group(group).num_rows
        for name in parquet.schema_arrow.names:
            try:
                parquet.read_row_group(group, columns=[name])
            except (pa.ArrowException, OSError):
                return (f" in rows {first_row} to {first_row + rows - 1} (row group {group + 1} of "
                        f"{parquet.num_row_groups}), column '{name}'")
        first_row += rows
    return ""
