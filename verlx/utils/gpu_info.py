"""What the driver may learn about its GPUs without creating a CUDA context (which would hold memory on GPU 0 for
the whole run): NVML, when the nvidia-ml-py package is installed."""

from __future__ import annotations

import os


def _first_visible_index() -> int | str:
    """The NVML index (or UUID) of the first GPU CUDA_VISIBLE_DEVICES lets this process use."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    if not visible:
        return 0
    return int(visible) if visible.isdigit() else visible


def visible_gpu_total_bytes() -> int | None:
    """Total memory of the first visible GPU by NVML; None without NVML or a GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        index = _first_visible_index()
        if isinstance(index, int):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        else:
            handle = pynvml.nvmlDeviceGetHandleByUUID(index)
        return int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
    except pynvml.NVMLError:
        return None
    finally:
        pynvml.nvmlShutdown()
