"""Checkpoint manifests on real checkpoint files (torch.distributed.checkpoint shards, torch.save extras): a
truncated file, a deleted shard or a replaced file is found and named before a resume trusts the checkpoint, and
resume_mode=auto falls back to the newest intact checkpoint."""

from __future__ import annotations

import json
import logging
import os
import warnings

import pytest
import torch

from verlx.config.loader import ConfigError
from verlx.config.run import TrainerConfig
from verlx.trainer import checkpoint_manifest, checkpointing


def save_checkpoint(root, step: int, seed: int = 0) -> str:
    """A checkpoint as the trainer writes one: actor shards and extras, driver state, config, then finalize."""
    import torch.distributed.checkpoint as dcp

    torch.manual_seed(seed + step)
    tmp = checkpointing.temp_step_dir(str(root), step)
    state = {"model": torch.nn.Linear(64, 32).state_dict(), "optim": {"step": torch.tensor(float(step))}}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        dcp.save(state, checkpoint_id=os.path.join(tmp, "actor", "dcp"))
    torch.save({"lr_scheduler": None, "world_size": 1}, os.path.join(tmp, "actor", "extra_rank0.pt"))
    checkpointing.write_driver_state(tmp, {"global_step": step}, {"trainer": {"seed": 1}})
    return checkpointing.finalize(tmp, str(root), step, use_critic=False)


def shard_of(path: str) -> str:
    (name,) = [n for n in os.listdir(os.path.join(path, "actor", "dcp")) if n.endswith(".distcp")]
    return f"actor/dcp/{name}"


def test_finalize_lists_every_file_with_size_and_checksum(tmp_path):
    path = save_checkpoint(tmp_path, 1)
    with open(os.path.join(path, checkpoint_manifest.MANIFEST)) as f:
        files = json.load(f)["files"]
    expected = {"actor/dcp/.metadata", shard_of(path), "actor/extra_rank0.pt", "data.pt", "config.json"}
    assert set(files) == expected  # COMPLETE is written after the manifest, the manifest does not list itself
    for rel, entry in files.items():
        assert entry["size"] == os.path.getsize(os.path.join(path, rel)) and len(entry["sha256"]) == 64
    assert not checkpoint_manifest.verify_manifest(path)
    assert checkpointing.checkpoint_damage(path) is None


def test_truncated_deleted_and_replaced_files_are_named(tmp_path):
    path = save_checkpoint(tmp_path, 1)
    shard = shard_of(path)
    size = os.path.getsize(os.path.join(path, shard))
    with open(os.path.join(path, shard), "r+b") as f:
        f.truncate(size - 10)
    os.remove(os.path.join(path, "actor", "extra_rank0.pt"))
    with open(os.path.join(path, "data.pt"), "r+b") as f:  # same size, other bytes
        f.seek(5)
        f.write(b"\x00\x01\x02")
    damage = checkpoint_manifest.verify_manifest(path)
    assert damage.missing == ["actor/extra_rank0.pt"]
    assert damage.wrong_size == [f"{shard} ({size - 10} bytes, {size} written)"]
    assert damage.wrong_hash == ["data.pt"]
    assert checkpointing.checkpoint_damage(path) == (
        f"missing: actor/extra_rank0.pt; size differs from the manifest (truncated or replaced): {shard} "
        f"({size - 10} bytes, {size} written); content differs from the manifest (checksum): data.pt")


def test_large_files_are_checked_by_size_and_their_first_and_last_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoint_manifest, "FULL_HASH_BYTES", 1000)
    monkeypatch.setattr(checkpoint_manifest, "EDGE_BYTES", 100)
    (tmp_path / "big.bin").write_bytes(bytes(range(256)) * 10)
    checkpoint_manifest.write_manifest(str(tmp_path))
    blob = bytearray((tmp_path / "big.bin").read_bytes())
    blob[3] ^= 0xFF  # a shard from another checkpoint differs from its first bytes on
    (tmp_path / "big.bin").write_bytes(blob)
    assert checkpoint_manifest.verify_manifest(str(tmp_path)).wrong_hash == ["big.bin"]


def test_auto_resume_walks_back_to_the_newest_intact_checkpoint(tmp_path, caplog):
    save_checkpoint(tmp_path, 1)
    newest = save_checkpoint(tmp_path, 2)
    shard = shard_of(newest)
    with open(os.path.join(newest, shard), "r+b") as f:
        f.truncate(100)
    cfg = TrainerConfig(default_local_dir=str(tmp_path), resume_mode="auto")
    with caplog.at_level(logging.WARNING, logger="verlx.trainer.checkpointing"):
        assert checkpointing.resolve_resume_path(cfg) == checkpointing.step_dir(str(tmp_path), 1)
    text = caplog.text
    assert f"checkpoint {newest} is damaged and is skipped" in text and shard in text
    assert f"resuming from {checkpointing.step_dir(str(tmp_path), 1)}, the newest intact checkpoint" in text


def test_explicit_damaged_checkpoint_is_an_error_naming_the_files(tmp_path):
    path = save_checkpoint(tmp_path, 3)
    shard = shard_of(path)
    os.remove(os.path.join(path, shard))
    cfg = TrainerConfig(resume_mode="resume_path", resume_from_path=path)
    with pytest.raises(ConfigError) as info:
        checkpointing.resolve_resume_path(cfg)
    assert f"trainer.resume_from_path={path}: cannot resume from {path}: missing: {shard}" in str(info.value)


def test_no_intact_checkpoint_at_all_is_an_error_not_a_fresh_start(tmp_path):
    path = save_checkpoint(tmp_path, 1)
    os.remove(os.path.join(path, "data.pt"))
    with pytest.raises(ConfigError) as info:
        checkpointing.resolve_resume_path(TrainerConfig(default_local_dir=str(tmp_path), resume_mode="auto"))
    text = str(info.value)
    assert "no intact checkpoint" in text and "missing: data.pt" in text and "trainer.resume_mode=disable" in text


def test_checkpoints_without_a_manifest_need_their_main_files(tmp_path, caplog):
    path = save_checkpoint(tmp_path, 1)
    os.remove(os.path.join(path, checkpoint_manifest.MANIFEST))  # as written before manifests existed
    with caplog.at_level(logging.WARNING, logger="verlx.trainer.checkpointing"):
        assert checkpointing.checkpoint_damage(path) is None
    assert "written before checkpoints had a manifest" in caplog.text
    os.remove(os.path.join(path, "actor", "extra_rank0.pt"))
    assert checkpointing.checkpoint_damage(path) == "missing: actor/extra_rank0.pt"
