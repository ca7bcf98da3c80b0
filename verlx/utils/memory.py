"""The CUDA caching allocator between the training and the generation phase: its settings, and what it counts
without device memory while an engine sleeps.

Expandable segments stop fragmentation from repeated offload/reload during training, but the rollout engines
cannot live with them: tensors in expandable segments cannot be shared through CUDA IPC (SGLang's weight push),
vLLM's sleep-mode memory pool refuses them, and torch_memory_saver raises when PYTORCH_CUDA_ALLOC_CONF enables
them. So they are switched on at run time for training only, and kept out of the environment engine processes
inherit.

An in-process engine may sleep by unmapping memory under tensors it keeps (vLLM's sleep-mode pool): torch still
counts them as allocated. Every role of a colocated process reads that from here, so that each training phase's
peak can leave it out (workers/perf.training_phase_timer).
"""

from __future__ import annotations

from collections.abc import Callable

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


#: the process's sources of bytes allocated to torch that hold no device memory now (a sleeping in-process engine's
#: unmapped pool), by name: every role of a colocated worker process reads the same sum
_UNBACKED_SOURCES: dict[str, Callable[[], int]] = {}


def count_unbacked_allocations(name: str, source: Callable[[], int]) -> None:
    """Add (or replace) the source `name` of bytes this process's allocator counts without device memory."""
    _UNBACKED_SOURCES[name] = source


def unbacked_allocated_bytes() -> int:
    """What this process's torch allocator counts as allocated that holds no device memory now (0 when nothing
    registered a source)."""
    return sum(source() for source in _UNBACKED_SOURCES.values())
