"""Megatron dist-checkpoints of one role (model chunks, optimizer, extras) and their export to HF safetensors.

Layout of a role's directory (the same names as the FSDP backend's, so the driver's completeness checks hold):
  dcp/                megatron-core dist_checkpointing (torch_dist): global, layout-independent tensor keys,
                      so a checkpoint reloads under another TP/PP layout
  extra_rank{r}.pt    lr-schedule step and RNG state per rank
  huggingface/        config + tokenizer of the model, for export
"""

from __future__ import annotations

import json
import os
import re

import torch
import torch.distributed as dist

from verlx.workers.checkpoint_state import (
    HF_SUBDIR,
    load_rank_state,
    optimizer_settings,
    restore_optimizer_settings,
    save_hf_metadata,
    save_rank_state,
)
from verlx.workers.megatron.architectures import model_dims
from verlx.workers.megatron.optimizer_state import allocate_optimizer_state, load_optimizer_state
from verlx.workers.megatron.weight_layout import is_tied_copy, param_specs, split_to_hf, te_name

DIST_SUBDIR = "dcp"
# The distributed optimizer's state in a layout-independent form (gathered per DP group on save, sliced on load).
# megatron-core 0.16's default, fully_sharded_model_space, is deprecated and fails on save ("ShardedTensor.
# flattened_range is not supported", 2 x H100, 2026-11-26); dp_reshardable would pin the checkpoint to one TP/PP layout.
OPTIMIZER_SHARDING = {"distrib_optim_sharding_type": "fully_reshardable"}


class MegatronCheckpointManager:
    def __init__(self, chunks, optimizer=None, lr_scheduler=None, tokenizer=None, hf_config=None):
        self.chunks = [getattr(c, "module", c) for c in chunks]  # DDP wrappers have no sharded_state_dict
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self.tokenizer, self.hf_config = tokenizer, hf_config

    def _sharded(self, is_loading: bool) -> dict:
        state = {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(self.chunks)}
        if self.optimizer is not None:
            state["optimizer"] = self.optimizer.sharded_state_dict(dict(state), is_loading=is_loading,
                                                                    metadata=OPTIMIZER_SHARDING)
        return state

    def save(self, path: str) -> None:
        from megatron.core import dist_checkpointing

        os.makedirs(os.path.join(path, DIST_SUBDIR), exist_ok=True)
        dist_checkpointing.save(self._sharded(is_loading=False), os.path.join(path, DIST_SUBDIR))
        save_rank_state(path, self.lr_scheduler)
        save_hf_metadata(path, self.hf_config, self.tokenizer)
        if dist.is_initialized():
            dist.barrier()

    def load(self, path: str) -> None:
        from megatron.core import dist_checkpointing

        ckpt = os.path.join(path, DIST_SUBDIR)
        if not os.path.isdir(ckpt):
            raise FileNotFoundError(f"checkpoint {path} has no {DIST_SUBDIR}/ directory (megatron dist-checkpoint)")
        settings = optimizer_settings(self.optimizer)
        allocate_optimizer_state(self.optimizer)
        state = dist_checkpointing.load(self._sharded(is_loading=True), ckpt)
        for i, chunk in enumerate(self.chunks):
            chunk.load_state_dict(state[f"model{i}"])
        if self.optimizer is not None:
            load_optimizer_state(self.optimizer, state["optimizer"])
        restore_optimizer_settings(self.optimizer, settings)
        load_rank_state(path, self.lr_scheduler)


# ---------------------------------------------------------------------- initial weights from a dist-checkpoint
def _checkpoint_dir(path: str) -> str:
    """A dist-checkpoint directory: `path` itself, or its dcp/ (verlx's global_step_N/actor)."""
    from verlx.utils.paths import expand_path

    path = expand_path(path)
    inner = os.path.join(path, DIST_SUBDIR)
    if os.path.isfile(os.path.join(inner, ".metadata")):
        return inner
    if not os.path.isfile(os.path.join(path, ".metadata")):
        raise FileNotFoundError(f"megatron.dist_checkpointing_path={path} is not a megatron dist-checkpoint (no "
                                f".metadata in it or in its {DIST_SUBDIR}/)")
    return path


def _stored_name(key: str, stored) -> str | None:
    """The checkpoint's name for one of our sharded keys: ours ("gpt." prefix, local layer spec), a bare GPTModel's
    (megatron's and veRL's converters), either with transformer-engine's layer names."""
    bare = key.removeprefix("gpt.")
    for candidate in (key, bare, te_name(key), te_name(bare)):
        if candidate in stored:
            return candidate
    return None


def load_dist_weights(chunks, path: str) -> None:
    """The model weights of a dist-checkpoint (any TP/PP layout) into this rank's chunks (use_dist_checkpointing).

    A value head absent from the checkpoint (a policy checkpoint for a critic) keeps its zero initialisation;
    any other parameter the checkpoint lacks is an error naming it.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    ckpt = _checkpoint_dir(path)
    stored = _dist_keys(ckpt)
    for chunk in chunks:
        sharded, missing = {}, []
        for name, value in chunk.sharded_state_dict().items():
            if not isinstance(value, (ShardedTensor, ShardedTensorFactory)):  # a factory: the fused gate/up weight
                continue  # extra states (ShardedObject): nothing the local layers read
            found = _stored_name(value.key, stored)
            if found is None:
                if not name.startswith("value_head."):
                    missing.append(value.key)
                continue
            value.key = found
            sharded[name] = value
        if missing:
            raise KeyError(f"megatron.dist_checkpointing_path={path} has no tensors for {missing[:5]}"
                           f"{' ...' if len(missing) > 5 else ''}; is it a checkpoint of this model?")
        chunk.load_state_dict(dist_checkpointing.load(sharded, ckpt), strict=False)


# ---------------------------------------------------------------------- export to HF
def _dist_keys(ckpt: str) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(ckpt).read_metadata()
    return {k: (tuple(m.size), m.properties.dtype) for k, m in metadata.state_dict_metadata.items()
            if isinstance(m, TensorStorageMetadata)}


def _read(ckpt: str, key: str, shape, dtype) -> torch.Tensor:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    state = {key: torch.empty(shape, dtype=dtype)}
    # no_dist: a plain read on this process alone, also inside a process group (export runs on one rank)
    dcp.load(state, storage_reader=FileSystemReader(ckpt), no_dist=True)
    return state[key]


def _stored_key(name: str, keys) -> str:
    """The dist-checkpoint key of a megatron parameter: layer index stripped (layers are stacked on dim 0), and an
    expert's index too (megatron stacks experts on dim 1 under `experts.experts.` for `experts.local_experts.<e>.`)."""
    generic = "gpt." + name.split(".", 3)[0] + ".layers." + name.split(".", 3)[3] if ".layers." in name \
        else "gpt." + name
    generic = re.sub(r"experts\.local_experts\.\d+\.", "experts.experts.", generic)
    for candidate in (generic, te_name(generic)):
        if candidate in keys:
            return candidate
    raise KeyError(f"the checkpoint has no tensor for megatron parameter {name} (looked for {generic!r})")


def export_megatron_checkpoint(ckpt_dir: str, out_dir: str, max_shard_bytes: int = 4 << 30,
                               dtype: torch.dtype | None = None) -> list[str]:
    """Write a megatron actor checkpoint (`.../global_step_N/actor`) as an HF model directory (safetensors shards,
    index, config, tokenizer); one stacked parameter is in memory at a time. Returns the files written.

    This is the megatron half of `python -m verlx.model_merger`; no process group is needed.
    """
    from safetensors.torch import save_file
    from transformers import AutoConfig

    hf_src = os.path.join(ckpt_dir, HF_SUBDIR)
    ckpt = os.path.join(ckpt_dir, DIST_SUBDIR)
    if not os.path.isdir(ckpt) or not os.path.isdir(hf_src):
        raise FileNotFoundError(f"{ckpt_dir} is not a megatron role checkpoint: it needs {DIST_SUBDIR}/ and "
                                f"{HF_SUBDIR}/ (point at global_step_N/actor)")
    hf_config = AutoConfig.from_pretrained(hf_src)
    dims = model_dims(hf_config)
    keys = _dist_keys(ckpt)
    groups: dict[str, list] = {}
    for spec in param_specs(dims):
        if not is_tied_copy(spec, dims):
            groups.setdefault(_stored_key(spec.name, keys), []).append(spec)
    os.makedirs(out_dir, exist_ok=True)
    written: list[tuple[str, list[str]]] = []  # (temporary file, tensor names)
    shard: dict[str, torch.Tensor] = {}
    size = 0

    def flush() -> None:
        nonlocal shard, size
        tmp = os.path.join(out_dir, f".shard-{len(written):05d}.tmp")
        save_file(shard, tmp, metadata={"format": "pt"})
        written.append((tmp, list(shard)))
        shard, size = {}, 0

    for key, specs in groups.items():
        stacked = _read(ckpt, key, *keys[key])  # every layer's copy of one parameter: read once
        for spec in specs:
            merged = stacked[spec.layer] if spec.layer is not None else stacked
            merged = merged[spec.expert] if spec.expert is not None else merged
            for name, tensor in split_to_hf(spec, merged, dims):
                tensor = tensor.to(dtype) if dtype is not None else tensor
                nbytes = tensor.numel() * tensor.element_size()
                if shard and size + nbytes > max_shard_bytes:
                    flush()
                shard[name] = tensor.contiguous().clone()
                size += nbytes
        del stacked
    if shard:
        flush()
    files, weight_map = [], {}
    for i, (tmp, names) in enumerate(written):
        fname = f"model-{i + 1:05d}-of-{len(written):05d}.safetensors" if len(written) > 1 else "model.safetensors"
        os.replace(tmp, os.path.join(out_dir, fname))
        files.append(fname)
        weight_map.update({n: fname for n in names})
    if len(written) > 1:
        with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {}, "weight_map": weight_map}, f, indent=1)
    for name in os.listdir(hf_src):
        if not name.endswith(".safetensors"):
            with open(os.path.join(hf_src, name), "rb") as src, open(os.path.join(out_dir, name), "wb") as dst:
                dst.write(src.read())
    return files
