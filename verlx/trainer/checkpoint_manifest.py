"""MANIFEST.json: every file of a checkpoint with its size and a SHA-256, written when the checkpoint is finalized
and checked before a resume trusts it.

What is hashed: all of a file up to FULL_HASH_BYTES (configs, data.pt, the per-rank extras, the shard index
`.metadata`, tokenizer files), and for larger files (the model/optimizer shards, gigabytes each) the first and the
last EDGE_BYTES. Hashing whole shards would re-read the entire checkpoint at every save and every resume (minutes
for a 100 GB checkpoint on network storage). The damage seen in practice is a missing shard, a truncated file (a
killed copy, a full disk) or a file from another checkpoint: the first two change the size, the third the first
bytes of the shard (the tensors' data starts there). A bit flip deep inside a shard is not detected.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass

MANIFEST = "MANIFEST.json"
FULL_HASH_BYTES = 16 << 20
EDGE_BYTES = 1 << 20
_READ_CHUNK = 4 << 20


def _digest(path: str, size: int) -> str:
    """SHA-256 of the whole file when it is small, else of its first and last EDGE_BYTES."""
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        if size <= FULL_HASH_BYTES:
            while chunk := f.read(_READ_CHUNK):
                sha.update(chunk)
        else:
            sha.update(f.read(EDGE_BYTES))
            f.seek(size - EDGE_BYTES)
            sha.update(f.read(EDGE_BYTES))
    return sha.hexdigest()


def _files(root: str, skip: tuple[str, ...]) -> list[str]:
    out = []
    for folder, _, names in os.walk(root):
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), root)
            if rel not in skip:
                out.append(rel)
    return sorted(out)


def write_manifest(ckpt_dir: str, skip: tuple[str, ...] = ()) -> dict[str, dict]:
    """List every file under `ckpt_dir` (but `skip` and the manifest itself) in MANIFEST.json; returns the entries."""
    entries = {}
    for rel in _files(ckpt_dir, (MANIFEST, *skip)):
        path = os.path.join(ckpt_dir, rel)
        size = os.path.getsize(path)
        entries[rel] = {"size": size, "sha256": _digest(path, size)}
    with open(os.path.join(ckpt_dir, MANIFEST), "w") as f:
        json.dump({"version": 1, "full_hash_bytes": FULL_HASH_BYTES, "edge_bytes": EDGE_BYTES, "files": entries},
                  f, indent=1)
    return entries


def has_manifest(ckpt_dir: str) -> bool:
    return os.path.isfile(os.path.join(ckpt_dir, MANIFEST))


@dataclass
class Damage:
    """What is wrong with one checkpoint; empty when it matches its manifest."""

    missing: list[str]
    wrong_size: list[str]
    wrong_hash: list[str]
    unreadable_manifest: str | None = None

    def __bool__(self) -> bool:
        return bool(self.missing or self.wrong_size or self.wrong_hash or self.unreadable_manifest)

    def __str__(self) -> str:
        if self.unreadable_manifest:
            return f"{MANIFEST} cannot be read ({self.unreadable_manifest})"
        parts = []
        if self.missing:
            parts.append("missing: " + ", ".join(self.missing))
        if self.wrong_size:
            parts.append("size differs from the manifest (truncated or replaced): " + ", ".join(self.wrong_size))
        if self.wrong_hash:
            parts.append("content differs from the manifest (checksum): " + ", ".join(self.wrong_hash))
        return "; ".join(parts)


def verify_manifest(ckpt_dir: str) -> Damage:
    """Compare the files under `ckpt_dir` with its MANIFEST.json (files not listed there are not looked at)."""
    try:
        with open(os.path.join(ckpt_dir, MANIFEST)) as f:
            entries = json.load(f)["files"]
    except (OSError, ValueError, KeyError) as e:
        return Damage([], [], [], unreadable_manifest=f"{type(e).__name__}: {e}")
    damage = Damage([], [], [])
    for rel, expected in entries.items():
        path = os.path.join(ckpt_dir, rel)
        if not os.path.isfile(path):
            damage.missing.append(rel)
            continue
        size = os.path.getsize(path)
        if size != expected["size"]:
            damage.wrong_size.append(f"{rel} ({size} bytes, {expected['size']} written)")
        elif _digest(path, size) != expected["sha256"]:
            damage.wrong_hash.append(rel)
    return damage
