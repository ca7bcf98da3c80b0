"""Pure-torch layers for megatron's local layer spec when transformer-engine is absent.

megatron-core's own local attention materialises [b, heads, s, s] scores in a CUDA-only buffer and its torch
norm refuses sequence parallelism; these replace them: SDPA (flash / memory-efficient kernels, any device) and an
RMSNorm that marks its weight for megatron's sequence-parallel gradient all-reduce.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.module import MegatronModule


def _param_device(config) -> torch.device:
    if getattr(config, "use_cpu_initialization", False) or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


class RMSNorm(torch.nn.Module):
    """HF's RMSNorm arithmetic (fp32 statistics, cast back, then scale)."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-6, **_):
        super().__init__()
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype,
                                                    device=_param_device(config)))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dtype)


class SDPAttention(MegatronModule):
    """Causal core attention through torch.nn.functional.scaled_dot_product_attention (grouped-query aware).

    Inputs are megatron's [s, b, heads, head_dim]; the output is [s, b, heads·head_dim]. Sequences are
    left-aligned by the caller, so the causal mask is the only mask needed.
    """

    def __init__(self, config, layer_number: int, attn_mask_type=None, attention_type: str = "self",
                 attention_dropout: float | None = None, softmax_scale: float | None = None, **_):
        super().__init__(config=config)
        if config.context_parallel_size > 1:
            raise ValueError("context_parallel_size > 1 needs transformer-engine's attention; install "
                             "transformer-engine or set megatron.context_parallel_size=1")
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask=None, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        if packed_seq_params is not None or attention_bias is not None:
            raise NotImplementedError("SDPAttention supports neither packed sequences nor attention bias")
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, d]
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.softmax_scale,
                                             enable_gqa=q.shape[1] != k.shape[1])
        s, b = query.shape[0], query.shape[1]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


def allow_moe_router_without_transformer_engine() -> None:
    """megatron-core 0.16's MoE router reads `te_general_gemm`, a name it imports only from transformer-engine:
    without it every routing step fails with a NameError. Defined as None, the router takes its torch path."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

