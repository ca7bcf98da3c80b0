"""Rotary position tables for every position the engine can reach, with the scaling variants HF configs use.

The math follows transformers' rope initialisers (default, linear, dynamic NTK, llama3, yarn) so that a
checkpoint rotates exactly as it did in training. Tables are built once per engine: decode looks rows up by
position, so no RoPE work is left in the decode step beyond two multiplies.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch

from verlx.utils.registry import Registry

# fn(params, dim, max_position_embeddings, positions) -> (inv_freq [dim/2] or [len(positions), dim/2], attention factor)
RopeFn = Callable[[dict, int, int, torch.Tensor], tuple[torch.Tensor, float]]
ROPE_TYPES: Registry[RopeFn] = Registry("rope scaling type", "rope_scaling.rope_type in the model's config.json")


def rope_parameters(hf_config) -> dict[str, Any]:
    """The rope settings of a transformers 4.x (rope_theta + rope_scaling) or 5.x (rope_parameters) config."""
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and "rope_theta" in params:
        params = dict(params)
    else:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
        params["rope_theta"] = float(getattr(hf_config, "rope_theta", 10000.0))
    params["rope_type"] = params.get("rope_type", params.get("type", "default"))
    if float(params.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError("partial_rotary_factor != 1 is not supported by the native engine; use rollout.name=hf")
    return params


def _base_inv_freq(theta: float, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (theta ** exponents)


@ROPE_TYPES.register("default")
def _default(params, dim, max_pos, positions):
    return _base_inv_freq(params["rope_theta"], dim), 1.0


@ROPE_TYPES.register("linear")
def _linear(params, dim, max_pos, positions):
    return _base_inv_freq(params["rope_theta"], dim) / params["factor"], 1.0


@ROPE_TYPES.register("dynamic")
def _dynamic(params, dim, max_pos, positions):
    """NTK-aware scaling. HF rescales the base from the longest position seen so far; a token at position p is
    rotated here with the base for sequence length max(p + 1, max_position_embeddings), which is what HF
    computes when it generates that token (identical to HF for every sequence within the original context)."""
    factor = params["factor"]
    seq_len = torch.clamp(positions.to(torch.float64) + 1, min=max_pos)
    bases = params["rope_theta"] * ((factor * seq_len / max_pos) - (factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
    return 1.0 / (bases.to(torch.float32)[:, None] ** exponents[None, :]), 1.0


@ROPE_TYPES.register("llama3")
def _llama3(params, dim, max_pos, positions):
    inv_freq = _base_inv_freq(params["rope_theta"], dim)
    factor = params["factor"]
    low, high = params["low_freq_factor"], params["high_freq_factor"]
    old_len = params["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    # long wavelengths are slowed by `factor`, short ones kept, the band between blended smoothly
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    in_band = ~(wavelen < old_len / high) * ~(wavelen > old_len / low)
    return torch.where(in_band, blended, scaled), 1.0


@ROPE_TYPES.register("yarn")
def _yarn(params, dim, max_pos, positions):
    base = params["rope_theta"]
    original = params.get("original_max_position_embeddings") or max_pos
    factor = params.get("factor") or max_pos / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention_factor = params.get("attention_factor")
    if attention_factor is None:
        m, m_all = params.get("mscale"), params.get("mscale_all_dim")
        attention_factor = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(params.get("beta_fast") or 32), correction_dim(params.get("beta_slow") or 1)
    if params.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1 - ramp  # share of the unscaled frequency per dimension
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


def rope_tables(
    hf_config, head_dim: int, max_len: int, dtype: torch.dtype, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin [max_len, head_dim] (both halves repeated, HF layout) in the model dtype."""
    params = rope_parameters(hf_config)
    fn = ROPE_TYPES.get(params["rope_type"])
    positions = torch.arange(max_len, dtype=torch.int64)
    max_pos = int(getattr(hf_config, "max_position_embeddings", 2048))
    inv_freq, attention_factor = fn(params, head_dim, max_pos, positions)
    freqs = positions.to(torch.float32)[:, None] * (inv_freq if inv_freq.dim() == 2 else inv_freq[None, :])
    angles = torch.cat((freqs, freqs), dim=-1)
    cos = (angles.cos() * attention_factor).to(dtype)
    sin = (angles.sin() * attention_factor).to(dtype)
    return cos.to(device), sin.to(device)
