"""Streaming an FSDP2 model's full parameters, one tensor at a time, in the same order on every rank."""

from __future__ import annotations

from typing import Iterator

import torch


def iter_full_params(module: torch.nn.Module, dtype: torch.dtype | None, device: torch.device,
                     strip_prefix: str = "") -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every entry of the state dict; `full_tensor()` is collective, so every rank iterates.

    Only one gathered tensor is alive per step of the iterator (plus whatever the consumer keeps).
    """
    for name, tensor in module.state_dict().items():
        if hasattr(tensor, "full_tensor"):
            tensor = tensor.full_tensor()
        tensor = tensor.to(device=device, dtype=dtype if dtype is not None and tensor.is_floating_point() else None)
        yield name.removeprefix(strip_prefix), tensor
