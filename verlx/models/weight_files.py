"""A model directory's files checked before Ray starts: config.json must parse, every safetensors shard the index
names must exist, and each shard must be as long as its header says (a download or copy that was cut short).
Only the headers are read, so the check costs milliseconds whatever the model's size."""

from __future__ import annotations

import glob
import json
import os

INDEX = "model.safetensors.index.json"
HEADER_LENGTH_BYTES = 8


def model_dir_problems(directory: str, key: str) -> list[str]:
    """What is wrong with the HF model directory `directory` (named by config key `key`), each naming the file."""
    problems = []
    config = os.path.join(directory, "config.json")
    if os.path.isfile(config):
        problem = _json_problem(config)
        if problem:
            problems.append(f"{key}: {config} is not valid JSON ({problem}); restore it (download or copy the model "
                            "again)")
    shards, index_problem = _safetensors_files(directory)
    if index_problem:
        problems.append(f"{key}: {index_problem}")
    for shard in shards:
        problem = safetensors_problem(shard)
        if problem:
            problems.append(f"{key}: {shard} {problem}; download or copy the model again")
    return problems


def _json_problem(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8") as f:
            json.load(f)
    except ValueError as e:
        return str(e)
    except OSError as e:
        return f"unreadable: {e.strerror}"
    return None


def _safetensors_files(directory: str) -> tuple[list[str], str | None]:
    """The shards to check (those the index names, or every *.safetensors) and a problem with the index itself."""
    index = os.path.join(directory, INDEX)
    if not os.path.isfile(index):
        return sorted(glob.glob(os.path.join(directory, "*.safetensors"))), None
    problem = _json_problem(index)
    if problem:
        return [], f"{index} is not valid JSON ({problem}); download or copy the model again"
    with open(index, encoding="utf-8") as f:
        names = sorted(set((json.load(f).get("weight_map") or {}).values()))
    missing = [n for n in names if not os.path.isfile(os.path.join(directory, n))]
    if missing:
        return [], (f"{index} lists {len(names)} weight files, of which {len(missing)} are missing from {directory}: "
                    f"{', '.join(missing[:5])}{', ...' if len(missing) > 5 else ''}; download or copy the model again")
    return [os.path.join(directory, n) for n in names], None


def safetensors_problem(path: str) -> str | None:
    """Why the safetensors file at `path` is unusable ('is truncated: ...'); None when its size fits its header."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(HEADER_LENGTH_BYTES)
        if len(head) < HEADER_LENGTH_BYTES:
            return f"is truncated: {size} bytes, not even the 8-byte header length"
        header_bytes = int.from_bytes(head, "little")
        if header_bytes > size - HEADER_LENGTH_BYTES:
            return f"is truncated or not a safetensors file: its header would need {header_bytes} bytes of {size}"
        try:
            header = json.loads(f.read(header_bytes))
        except ValueError:
            return "is damaged: its header is not valid JSON"
    ends = [entry["data_offsets"][1] for name, entry in header.items()
            if name != "__metadata__" and isinstance(entry, dict) and "data_offsets" in entry]
    expected = HEADER_LENGTH_BYTES + header_bytes + max(ends, default=0)
    if size < expected:
        return f"is truncated: {size} bytes, but its header describes {expected}"
    return None
