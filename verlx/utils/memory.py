"""CUDA caching-allocator settings that differ between the training and the generation phase.

Expandable segments stop fragmentation from repeated offload/reload during training, but the rollout engines
cannot live with them: tensors in expandable segments cannot be shared through CUDA IPC (SGLang's weight push),
vLLM's sleep-mode memory pool refuses them, and torch_memory_saver raises when PYTORCH_CUDA_ALLOC_CONF enables
them. So they are switched on at run time for training only, and kept out of the environment engine processes
inherit.
"""

from __future__ import annotations

import torch

ALLOC_CONF_ENV = "PYTORCH_CUDA_ALLOC_CONF"


def set_expandable_segments(enabled: bool) -> None:
    """Turn expandable segments on (training) or off (weight push and generation); a no-op without CUDA."""
    if not torch.cuda.is_available():
        return
    torch.cuda.memory._set_allocator_settings(f"expandable_segments:{'True' if enabled else 'False'}")


def alloc_conf_without_expandable_segments(conf: str | None) -> str | None:
    """PYTORCH_CUDA_ALLOC_CONF with any expandable_segments entry removed (None when nothing is left)."""
    if not conf:
        return conf
    kept = [
        item
        for item in conf.split(",")
        if item.strip() and item.split(":", 1)[0].strip() != "expandable_segments"
    ]
    return ",".join(kept) or None
