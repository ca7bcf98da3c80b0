"""Config dtype strings → torch dtypes."""

from __future__ import annotations

import torch

DTYPES = {
    "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
    "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
    "float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
}


def torch_dtype(name: str, key: str = "dtype") -> torch.dtype:
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"{key}={name!r} is not one of {sorted(DTYPES)}") from None
