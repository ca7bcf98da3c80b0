"""Training FLOPs of a batch and the device's peak, for MFU (veRL's FlopsCounter convention).

Per token, forward + backward of every dense matmul costs 6 × its parameter count: the q/k/v/o projections and
the gated MLP of each layer, plus 2 × vocab × hidden for the embedding and the output projection (counted twice
even when tied, as veRL does). Attention scores and the weighted sum cost 4 · s² · heads · head_dim per layer
forward for a sequence of length s, 12 · s² · heads · head_dim forward + backward; causal masking halves that,
so the attention term is 6 · layers · heads · head_dim · Σ s² (veRL's number). Padding is not work: `seq_lens`
are real token counts.
"""

from __future__ import annotations

import os

import torch

from verlx.utils.registry import Registry

FLOPS_ESTIMATORS: Registry = Registry("FLOPs estimator (HF model_type)")

# Peak dense bf16 tensor-core TFLOP/s (no sparsity) by a substring of torch.cuda.get_device_name();
# the longest matching key wins ("H100 PCIe" before "H100").
PEAK_BF16_TFLOPS = {
    "GB200": 2500.0,
    "B200": 2250.0,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.0,
    "H800": 989.0,
    "H200": 989.0,
    "H20": 148.0,
    "GH200": 989.0,
    "A100": 312.0,
    "A800": 312.0,
    "L40S": 362.0,
    "L40": 181.0,
    "A40": 149.7,
    "L20": 119.5,
    "L4": 121.0,
    "A10G": 70.0,
    "MI300X": 1307.0,
}


PEAK_ENV = "VERLX_PEAK_TFLOPS"


def device_peak_tflops(device_name: str | None = None) -> float | None:
    """Peak dense bf16 TFLOP/s of `device_name` (default: the current CUDA device); None for CPU or unknown.

    The environment variable VERLX_PEAK_TFLOPS, when set, is the answer for any device (a GPU missing from the
    table, or a deliberate reference number).
    """
    if os.environ.get(PEAK_ENV):
        try:
            return float(os.environ[PEAK_ENV])
        except ValueError:
            raise ValueError(f"{PEAK_ENV}={os.environ[PEAK_ENV]!r} is not a number of TFLOP/s") from None
    if device_name is None:
        if not torch.cuda.is_available():
            return None
        device_name = torch.cuda.get_device_name()
    matches = [key for key in PEAK_BF16_TFLOPS if key in device_name]
    return PEAK_BF16_TFLOPS[max(matches, key=len)] if matches else None


@FLOPS_ESTIMATORS.register("qwen2")
@FLOPS_ESTIMATORS.register("qwen3")
@FLOPS_ESTIMATORS.register("llama")
@FLOPS_ESTIMATORS.register("mistral")
def dense_decoder_flops(config, seq_lens: list[int]) -> float:
    """Forward + backward FLOPs of a dense GQA decoder with a gated (SwiGLU) MLP over sequences of `seq_lens`."""
    hidden, layers = config.hidden_size, config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention_params = hidden * (2 * heads * head_dim + 2 * kv_heads * head_dim)  # q, o and k, v projections
    mlp_params = 3 * hidden * config.intermediate_size  # gate, up, down
    dense_params = (attention_params + mlp_params) * layers + 2 * config.vocab_size * hidden
    dense = 6 * dense_params * sum(seq_lens)
    attention = 6 * layers * heads * head_dim * sum(s * s for s in seq_lens)
    return float(dense + attention)


@FLOPS_ESTIMATORS.register("qwen2_vl")
@FLOPS_ESTIMATORS.register("qwen2_5_vl")
@FLOPS_ESTIMATORS.register("qwen3_vl")
def vision_language_flops(config, seq_lens: list[int]) -> float:
    """A vision-language model's text decoder over its sequences, image tokens included; the vision tower's FLOPs
    are not counted (MFU is understated by their share)."""
    return dense_decoder_flops(config.get_text_config(), seq_lens)


def estimate_flops(hf_config, seq_lens: list[int], seconds: float,
                   device_name: str | None = None) -> tuple[float, float | None]:
    """(achieved TFLOP/s of training on `seq_lens` in `seconds`, the device's peak TFLOP/s or None on CPU).

    MFU = achieved / peak for one device; for a step over N devices divide the global achieved by N × peak.
    """
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    flops = FLOPS_ESTIMATORS.get(hf_config.model_type)(hf_config, seq_lens)
    return flops / seconds / 1e12, device_peak_tflops(device_name)
