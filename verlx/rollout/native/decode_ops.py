"""Decode-step attention backends: `torch` (everywhere) and `triton` (fused kernels, CUDA bf16/fp16).

A backend owns the part of a decode layer between the fused qkv projection and the output projection —
q/k norm, RoPE, the KV-cache write, attention — plus the SwiGLU activation and the decode step's RMSNorms. `torch`
attends over a KV-length bucket with an additive mask (one SDPA call; its graphs are keyed by that bucket); `triton`
reads exactly each slot's length, so its graphs need no length bucket and no mask.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from verlx.utils.registry import Registry

logger = logging.getLogger(__name__)

DECODE_BACKENDS: Registry[Callable[..., Any]] = Registry(
    "native decode backend", "actor_rollout_ref.rollout.engine_kwargs.native.decode_backend"
)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """x*cos + rotate_half(x)*sin, with rotate_half(x)*sin = roll(x, D/2) * cat(-sin, sin): 4 kernels, same bits."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * sin_signed


@DECODE_BACKENDS.register("torch")
class TorchDecodeOps:
    """Plain torch ops; SDPA over cache[:b, :, :kv_len] with the G query heads of a KV head as G queries."""

    reads_exact_lengths = False

    def __init__(self, model):
        self.model = model
        # device scalars made here, not in the decode step: a host-to-device copy cannot be graph-captured
        self._mask_values = (
            torch.zeros((), dtype=model.cos.dtype, device=model.cos.device),
            torch.full((), float("-inf"), dtype=model.cos.dtype, device=model.cos.device),
        )

    def prepare(self, pos: torch.Tensor, kv_len: int, cache) -> dict:
        """Per-step values shared by all layers: rope rows, masks per window, cache write index."""
        m = self.model
        keys = m.key_positions[None, :kv_len]
        visible = keys <= pos[:, None]
        zero, hidden = self._mask_values
        masks = {None: torch.where(visible, zero, hidden)[:, None, None, :]}
        for w in m.windows:
            masks[w] = torch.where(visible & (keys > pos[:, None] - w), zero, hidden)[:, None, None, :]
        return dict(
            cos=m.cos.index_select(0, pos)[:, None, :],
            sin=m.sin_signed.index_select(0, pos)[:, None, :],
            masks=masks,
            where=cache.decode_index(pos),
            kv_len=kv_len,
        )

    def attention(self, i: int, lw: dict, qkv: torch.Tensor, step: dict, cache) -> torch.Tensor:
        s = self.model.spec
        b = qkv.shape[0]
        hq, hkv, d = s.num_heads, s.num_kv_heads, s.head_dim
        qkv = qkv.view(b, hq + 2 * hkv, d)
        qk = qkv[:, : hq + hkv]
        if s.features.qk_norm:
            qk = F.rms_norm(qk, (d,), None, s.rms_norm_eps) * lw["qk_norm"]
        qk = rotate(qk, step["cos"], step["sin"])
        cache.write_decode(i, step["where"], qk[:, hq:], qkv[:, hq + hkv :])
        k_cache, v_cache = cache.layer(i)
        kv_len = step["kv_len"]
        attn = F.scaled_dot_product_attention(
            qk[:, :hq].reshape(b, hkv, s.group_size, d),
            k_cache[:b, :, :kv_len],
            v_cache[:b, :, :kv_len],
            attn_mask=step["masks"][s.sliding_windows[i]],
        )
        return attn.reshape(b, hq * d)

    @staticmethod
    def swiglu(gate_up: torch.Tensor) -> torch.Tensor:
        inter = gate_up.shape[-1] // 2
        return F.silu(gate_up[:, :inter]) * gate_up[:, inter:]

    @staticmethod
    def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
        """HF's RMSNorm: statistics in float32, normalised value cast back, then scaled (one kernel on recent torch)."""
        return F.rms_norm(x, (x.shape[-1],), weight, eps)


@DECODE_BACKENDS.register("triton")
def _triton_backend(model):
    from verlx.rollout.native.triton_ops import TritonDecodeOps

    return TritonDecodeOps(model)


def triton_usable(device: torch.device, dtype: torch.dtype) -> str | None:
    """None if the triton backend can run here, else why not."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    if device.type != "cuda" and not interpreted:
        return f"device is {device.type}, not cuda"
    if dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {dtype} (the kernels are for bfloat16/float16)"
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    return None


def select_backend(name: str, device: torch.device, dtype: torch.dtype) -> str:
    """`auto` -> triton where usable, else torch; an explicit `triton` that cannot run is an error."""
    if name == "auto":
        return "triton" if triton_usable(device, dtype) is None else "torch"
    DECODE_BACKENDS.get(name)
    if name == "triton":
        why = triton_usable(device, dtype)
        if why is not None:
            raise ValueError(f"engine_kwargs.native.decode_backend=triton cannot run: {why}; use auto or torch")
    return name


def check_backend(model, name: str, cache) -> bool:
    """Compare a backend against torch on random inputs (one decode layer); False (and a warning) on error
    or mismatch, so a kernel that does not compile or misbehaves on this GPU is never used silently."""
    if name == "torch":
        return True
    try:
        from verlx.rollout.native.triton_ops import self_test

        error = self_test(model, cache)
    except Exception as err:  # compile errors of a new triton / GPU
        error = f"{type(err).__name__}: {err}"
    if error:
        logger.warning("native engine: %s decode backend failed its self-test (%s); using torch", name, error)
        return False
    return True
