"""Moving trainer weights into an engine: HF names, engine dtype, bounded buckets."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

# Wrapper prefixes that FSDP, torch.compile, activation checkpointing and PEFT put into parameter names.
_WRAPPER_PARTS = ("_fsdp_wrapped_module.", "_orig_mod.", "_checkpoint_wrapped_module.")


def hf_param_name(name: str) -> str:
    """The HuggingFace checkpoint name of a (possibly wrapped) parameter name."""
    for part in _WRAPPER_PARTS:
        name = name.replace(part, "")
    return name


def iter_engine_weights(
    named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None, tie_word_embeddings: bool
) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors in the engine dtype; lm_head dropped when it is tied to the embeddings."""
    for name, tensor in named_tensors:
        name = hf_param_name(name)
        if tie_word_embeddings and name == "lm_head.weight":
            continue
        yield name, (tensor.to(dtype) if dtype is not None and tensor.is_floating_point() else tensor)


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
