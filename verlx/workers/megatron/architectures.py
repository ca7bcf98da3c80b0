"""HF model configs → the dimensions megatron needs, per architecture, and the TransformerConfig / GPTModel kwargs.

Pure functions of the HF config: no megatron-core import, so they are tested on any machine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verlx.utils.registry import Registry


@dataclass(frozen=True)
class ModelDims:
    """What the weight converter and the model builder need to know about a decoder-only checkpoint."""

    architecture: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    ffn_hidden_size: int
    vocab_size: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    rope_scaling_factor: float | None = None  # llama3-style scaling when set
    num_experts: int = 0  # mixture-of-experts layers (every layer) when > 0
    moe_topk: int = 0
    moe_ffn_hidden_size: int = 0
    moe_renormalize: bool = True  # top-k routing weights renormalised to sum to 1 (HF's norm_topk_prob)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab_size(self, tp: int) -> int:
        """Megatron shards the vocabulary evenly over TP ranks: round up to a multiple of tp."""
        return -(-self.vocab_size // tp) * tp


ARCHITECTURES: Registry[Callable[[Any], ModelDims]] = Registry(
    "architecture with a megatron converter", "config.json 'architectures'"
)

# megatron-core's llama3 RoPE scaling has these constants built in; other values cannot be represented
_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def _rope(hf_config) -> tuple[float, float | None]:
    """(rope_theta, llama3 scaling factor or None) from transformers 4.x (rope_theta/rope_scaling) or 5.x
    (rope_parameters)."""
    params = getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {}
    theta = getattr(hf_config, "rope_theta", None) or params.get("rope_theta")
    if theta is None:
        raise ValueError(f"{type(hf_config).__name__} has no rope_theta (nor rope_parameters['rope_theta'])")
    kind = params.get("rope_type", params.get("type", "default")) or "default"
    if kind == "default":
        return float(theta), None
    if kind == "llama3":
        bad = {k: params.get(k) for k, v in _LLAMA3_FIXED.items() if float(params.get(k, v)) != v}
        if bad:
            raise ValueError(f"llama3 RoPE scaling with {bad}: megatron-core supports only {_LLAMA3_FIXED}")
        return float(theta), float(params.get("factor", 8.0))
    raise ValueError(f"RoPE scaling type {kind!r} has no megatron equivalent here; supported: default, llama3")


def _common(hf_config, architecture: str, qkv_bias: bool, qk_norm: bool) -> ModelDims:
    if getattr(hf_config, "hidden_act", "silu") != "silu":
        raise ValueError(f"{architecture}: hidden_act={hf_config.hidden_act!r}; the converter supports silu (SwiGLU)")
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    if heads % kv_heads:
        raise ValueError(f"{architecture}: num_attention_heads={heads} is not a multiple of "
                         f"num_key_value_heads={kv_heads}")
    theta, scaling = _rope(hf_config)
    return ModelDims(
        architecture=architecture,
        num_layers=hf_config.num_hidden_layers,
        hidden_size=hf_config.hidden_size,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        ffn_hidden_size=hf_config.intermediate_size,
        vocab_size=hf_config.vocab_size,
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        qk_norm=qk_norm,
        norm_eps=float(hf_config.rms_norm_eps),
        rope_theta=theta,
        max_position_embeddings=hf_config.max_position_embeddings,
        rope_scaling_factor=scaling,
    )


def _no_sliding_window(hf_config, architecture: str) -> None:
    if getattr(hf_config, "use_sliding_window", False):
        raise ValueError(f"{architecture}: use_sliding_window=true has no megatron equivalent here; set it to false")


@ARCHITECTURES.register("Qwen2ForCausalLM")
def _qwen2(hf_config) -> ModelDims:
    _no_sliding_window(hf_config, "Qwen2ForCausalLM")
    return _common(hf_config, "Qwen2ForCausalLM", qkv_bias=True, qk_norm=False)


@ARCHITECTURES.register("Qwen3ForCausalLM")
def _qwen3(hf_config) -> ModelDims:
    _no_sliding_window(hf_config, "Qwen3ForCausalLM")
    return _common(hf_config, "Qwen3ForCausalLM", qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
                   qk_norm=True)


@ARCHITECTURES.register("LlamaForCausalLM")
def _llama(hf_config) -> ModelDims:
    if getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False):
        raise ValueError("LlamaForCausalLM with attention_bias/mlp_bias: megatron has no bias on the output "
                         "projection alone; only bias-free Llama checkpoints are supported")
    return _common(hf_config, "LlamaForCausalLM", qkv_bias=False, qk_norm=False)


@ARCHITECTURES.register("Qwen3MoeForCausalLM")
def _qwen3_moe(hf_config) -> ModelDims:
    """Every layer a mixture of experts (no dense layers, no shared expert), softmax router with top-k."""
    _no_sliding_window(hf_config, "Qwen3MoeForCausalLM")
    dense = list(getattr(hf_config, "mlp_only_layers", None) or [])
    step = getattr(hf_config, "decoder_sparse_step", 1)
    if dense or step != 1:
        raise ValueError(f"Qwen3MoeForCausalLM with dense layers (mlp_only_layers={dense}, decoder_sparse_step="
                         f"{step}): the megatron converter supports models whose every layer is a mixture of experts")
    dims = _common(hf_config, "Qwen3MoeForCausalLM", qkv_bias=bool(getattr(hf_config, "attention_bias", False)),
                   qk_norm=True)
    return dataclasses.replace(dims, num_experts=hf_config.num_experts, moe_topk=hf_config.num_experts_per_tok,
                               moe_ffn_hidden_size=hf_config.moe_intermediate_size,
                               moe_renormalize=bool(getattr(hf_config, "norm_topk_prob", False)))


def architecture_of(hf_config) -> str:
    archs = list(getattr(hf_config, "architectures", None) or [])
    if not archs:
        by_type = {"qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM",
                   "qwen3_moe": "Qwen3MoeForCausalLM"}
        model_type = getattr(hf_config, "model_type", None)
        if model_type in by_type:
            return by_type[model_type]
        raise ValueError(f"config has no 'architectures' and model_type {model_type!r} is not one of "
                         f"{sorted(by_type)}; supported architectures: {', '.join(ARCHITECTURES.names())}")
    return archs[0]


def model_dims(hf_config) -> ModelDims:
    """The dims of a supported HF config; an unsupported architecture names the supported ones."""
    return ARCHITECTURES.get(architecture_of(hf_config))(hf_config)


def transformer_config_kwargs(dims: ModelDims, *, tp: int = 1, pp: int = 1, vpp: int | None = None, cp: int = 1,
                              sequence_parallel: bool = False, dtype: str = "bfloat16",
                              recompute: bool = False, use_te: bool = False, ep: int = 1,
                              etp: int | None = None) -> dict[str, Any]:
    """Keyword arguments of megatron.core.transformer.TransformerConfig for this model and layout."""
    import torch
    import torch.nn.functional as F

    params_dtype = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16,
                    "fp16": torch.float16, "float32": torch.float32, "fp32": torch.float32}[dtype]
    kwargs: dict[str, Any] = dict(
        num_layers=dims.num_layers,
        hidden_size=dims.hidden_size,
        num_attention_heads=dims.num_heads,
        num_query_groups=dims.num_kv_heads,
        kv_channels=dims.head_dim,
        ffn_hidden_size=dims.ffn_hidden_size,
        normalization="RMSNorm",
        layernorm_epsilon=dims.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=dims.qkv_bias,
        qk_layernorm=dims.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        context_parallel_size=cp,
        sequence_parallel=sequence_parallel and tp > 1,
        params_dtype=params_dtype,
        bf16=params_dtype is torch.bfloat16,
        fp16=params_dtype is torch.float16,
        pipeline_dtype=params_dtype,
        variable_seq_lengths=True,
        moe_token_dispatcher_type="alltoall",  # dense model; megatron rejects allgather with variable lengths
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )
    if dims.is_moe:
        # HF's router: softmax over all experts, top-k, renormalised when norm_topk_prob. megatron's softmax over the
        # top-k logits is that renormalisation; pre-softmax top-k keeps the raw probabilities. No auxiliary loss
        # (the FSDP policy adds none); override_transformer_config.moe_aux_loss_coeff & co. turn it on.
        kwargs.update(num_moe_experts=dims.num_experts, moe_router_topk=dims.moe_topk,
                      moe_ffn_hidden_size=dims.moe_ffn_hidden_size, moe_router_pre_softmax=not dims.moe_renormalize,
                      moe_router_score_function="softmax", moe_router_load_balancing_type="none",
                      moe_aux_loss_coeff=0.0, moe_grouped_gemm=False, expert_model_parallel_size=ep,
                      expert_tensor_parallel_size=etp or tp)
    if recompute:
        kwargs.update(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)
    if use_te:
        kwargs.update(bias_activation_fusion=True, bias_dropout_fusion=True)
    return kwargs


def gpt_model_kwargs(dims: ModelDims, tp: int = 1) -> dict[str, Any]:
    """Keyword arguments of megatron.core.models.gpt.GPTModel (besides config, layer spec, pre/post_process)."""
    kwargs: dict[str, Any] = dict(
        vocab_size=dims.padded_vocab_size(tp),
        max_sequence_length=dims.max_position_embeddings,
        position_embedding_type="rope",
        rotary_percent=1.0,
        rotary_base=dims.rope_theta,
        share_embeddings_and_output_weights=dims.tie_word_embeddings,
    )
    if dims.rope_scaling_factor is not None:
        kwargs.update(rope_scaling=True, rope_scaling_factor=dims.rope_scaling_factor)
    return kwargs
