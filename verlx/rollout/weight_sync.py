"""Moving trainer weights into an engine: HF names, engine dtype, bounded buckets, checked statuses."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from verlx.utils.dtypes import torch_dtype
from verlx.utils.errors import VerlxError

# Wrapper prefixes that FSDP, torch.compile, activation checkpointing and PEFT put into parameter names.
_WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_orig_mod.", "_checkpoint_wrapped_module.")
# Checkpoint entries that are buffers, not parameters: no trainer pushes them.
_NON_PARAMETER_SUFFIXES = ("rotary_emb.inv_freq",)


class WeightSyncError(VerlxError, RuntimeError):
    """An engine reported that it did not take a weight update."""

    def __init__(self, engine: str, names: list[str], message: str):
        self.engine, self.names, self.engine_message = engine, list(names), message
        shown = ", ".join(self.names[:8]) + (f", ... ({len(self.names)} in all)" if len(self.names) > 8 else "")
        super().__init__(f"{engine} rejected the weight update of [{shown}]: {message}")

    def __reduce__(self):
        return WeightSyncError, (self.engine, self.names, self.engine_message)


def hf_param_name(name: str) -> str:
    """The HuggingFace checkpoint name of a (possibly wrapped) parameter name."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def engine_dtype(name: str) -> torch.dtype:
    """torch dtype of a rollout.dtype string."""
    return torch_dtype(name, "actor_rollout_ref.rollout.dtype")


def engine_dtype_on(name: str, device: torch.device) -> torch.dtype:
    """The dtype an engine on `device` holds its weights in: rollout.dtype on GPU; float32 on CPU, where bf16
    matmuls are slow and would not match the fp32 trainer."""
    return engine_dtype(name) if device.type == "cuda" else torch.float32


def gather_full(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """Sharded (DTensor) tensors gathered one at a time: a collective, so every rank iterates in the same order."""
    for name, tensor in named_tensors:
        yield name, (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor)


def iter_engine_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]],
    dtype: torch.dtype | None,
    tie_word_embeddings: bool,
    device: torch.device | None = None,
    rename: Callable[[str], str] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named full tensors in the engine dtype (and on `device`); lm_head dropped when tied to the embeddings;
    `rename`: the engine's name of an HF name (a vision-language model's checkpoint layout).

    Sharded (DTensor) parameters are gathered one at a time with full_tensor(), a collective: every rank must
    iterate the same parameters in the same order, and the tied lm_head is skipped before gathering on all ranks.
    """
    kept = ((hf_param_name(n), t) for n, t in named_tensors)
    if rename is not None:
        kept = ((rename(n), t) for n, t in kept)
    kept = ((n, t) for n, t in kept if not (tie_word_embeddings and n == "lm_head.weight"))
    for name, tensor in gather_full(kept):
        tensor = tensor.detach()  # CUDA-IPC pickling refuses tensors that require grad
        if device is not None:
            tensor = tensor.to(device, non_blocking=True)
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        yield name, tensor


def iter_buckets(
    named_tensors: Iterable[tuple[str, torch.Tensor]], bucket_bytes: int
) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """Group tensors into lists of at most `bucket_bytes` (a single larger tensor gets a bucket of its own)."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket size must be positive, got {bucket_bytes} bytes")
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and size + nbytes > bucket_bytes:
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
    if bucket:
        yield bucket


def bucket_bytes_of(config) -> int:
    """rollout.update_weights_bucket_megabytes in bytes."""
    megabytes = int(config.update_weights_bucket_megabytes)
    if megabytes <= 0:
        raise ValueError(
            f"actor_rollout_ref.rollout.update_weights_bucket_megabytes={megabytes} must be positive"
        )
    return megabytes << 20


def update_status(result: Any) -> tuple[bool, str] | None:
    """(success, message) from the shapes engines return: a (success, message) pair, a dict or an object with
    `success` / `message`, or a bare bool. None when the call returned nothing."""
    if result is None:
        return None
    if isinstance(result, bool):
        return result, ""
    if isinstance(result, (tuple, list)) and len(result) >= 1 and isinstance(result[0], bool):
        return result[0], str(result[1]) if len(result) > 1 else ""
    if isinstance(result, dict) and "success" in result:
        return bool(result["success"]), str(result.get("message", ""))
    if hasattr(result, "success"):
        return bool(result.success), str(getattr(result, "message", ""))
    raise TypeError(f"unrecognised engine status {result!r}")


def check_update_status(result: Any, engine: str, names: list[str], *, required: bool = True) -> None:
    """Raise WeightSyncError unless the engine reported success (a call that returned nothing passes only when a
    status is not `required`)."""
    status = update_status(result)
    if status is None:
        if required:
            raise WeightSyncError(engine, names, "the engine returned no status")
        return
    success, message = status
    if not success:
        raise WeightSyncError(engine, names, message or "the engine reported failure without a message")


def _checkpoint_shapes(model_path: str) -> dict[str, tuple[int, ...]] | None:
    """Name -> shape of every tensor of an HF safetensors checkpoint, read from the file headers only."""
    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(model_path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        return None
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for name in files:
        with safe_open(os.path.join(model_path, name), framework="pt") as f:
            names = f.keys()  # a safetensors file handle: it has keys() but cannot be iterated
            shapes.update((key, tuple(f.get_slice(key).get_shape())) for key in names)
    return shapes


def checkpoint_tensor_names(model_path: str) -> frozenset[str] | None:
    """Parameter names stored in an HF safetensors checkpoint (the index, or one file's header), None when unknown."""
    index = os.path.join(model_path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            names = set(json.load(f)["weight_map"])
    else:
        shapes = _checkpoint_shapes(model_path)
        if shapes is None:
            return None
        names = set(shapes)
    return frozenset(n for n in names if not n.endswith(_NON_PARAMETER_SUFFIXES))


def checkpoint_numel(model_path: str) -> int | None:
    """Parameters stored in an HF safetensors checkpoint (headers only), None when unknown."""
    shapes = _checkpoint_shapes(model_path)
    if shapes is None:
        return None
    return sum(math.prod(shape) for name, shape in shapes.items() if not name.endswith(_NON_PARAMETER_SUFFIXES))


def expected_push_names(model_path: str, tie_word_embeddings: bool) -> frozenset[str] | None:
    """The HF names a full weight push must cover (lm_head excluded when tied)."""
    names = checkpoint_tensor_names(model_path)
    if names is None:
        return None
    return names - {"lm_head.weight"} if tie_word_embeddings else names
