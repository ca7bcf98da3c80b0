"""veRL's megatron override sections (override_transformer_config, override_optimizer_config, override_ddp_config):
megatron-core config fields a user sets on top of verlx's choices, and the ones verlx refuses, with the reason.

Refused: fields verlx derives from the HF config or from the megatron.* keys (set those instead); the pipeline
splits other than the first and last stages' layer counts (standalone embedding or loss stages, explicit layouts);
and, when transformer-engine (or DeepEP) is missing, the fields whose kernels
live there. Everything else reaches megatron-core unchanged. Pure functions: no megatron-core import here, the
field lists come from the caller (config checks pass megatron's dataclass fields when it is installed).
"""

from __future__ import annotations

import importlib.util
from typing import Any

from verlx.utils.registry import did_you_mean

# TransformerConfig fields verlx sets from the model's HF config and the megatron.* keys
DERIVED = frozenset({
    "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "kv_channels", "ffn_hidden_size",
    "normalization", "layernorm_epsilon", "gated_linear_unit", "activation_func", "add_bias_linear", "add_qkv_bias",
    "qk_layernorm", "tensor_model_parallel_size", "pipeline_model_parallel_size",
    "virtual_pipeline_model_parallel_size", "context_parallel_size", "expert_model_parallel_size",
    "expert_tensor_parallel_size", "sequence_parallel", "params_dtype", "bf16", "fp16", "pipeline_dtype",
    "variable_seq_lengths", "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_router_pre_softmax",
    "perform_initialization", "use_cpu_initialization",
})
# the first and last stages' layer counts are read (ParallelLayout.stage_layers); these other splits are refused
STAGE_LAYER_FIELDS = ("num_layers_in_first_pipeline_stage", "num_layers_in_last_pipeline_stage")
UNEVEN_PIPELINE = ("account_for_embedding_in_pipeline_split", "account_for_loss_in_pipeline_split",
                   "pipeline_model_parallel_layout")
# field → what it needs, refused when that is missing and the value asks for it (anything but None/False)
NEEDS_TRANSFORMER_ENGINE = {
    "fp8": "FP8 training", "fp4": "FP4 training", "moe_grouped_gemm": "grouped expert GEMMs",
    "moe_permute_fusion": "the fused token permutation", "gradient_accumulation_fusion":
    "the fused weight-gradient accumulation", "apply_rope_fusion": "the fused RoPE kernel",
    "persist_layer_norm": "the persistent layer-norm kernel",
}
NEEDS_DEEPEP = {"moe_enable_deepep": True, "moe_token_dispatcher_type": "flex"}
# fields of MindSpeed's TransformerConfig (megatron on Ascend NPUs) that megatron-core's lacks (veRL's NPU scripts)
MINDSPEED_FIELDS = frozenset({
    "use_flash_attn", "multi_head_latent_attention", "pipeline_num_transformer_layers", "use_fused_rotary_pos_emb",
    "rope_scaling_type", "yarn_scaling_factor", "rope_scaling_mscale", "rope_scaling_mscale_all_dim",
    "use_fused_swiglu", "seq_length", "swap_optimizer",
})
# DistributedDataParallelConfig fields with a megatron.* key of their own
DDP_KEYS = {"use_distributed_optimizer": "use_distributed_optimizer"}


def stage_layer_overrides(overrides: dict[str, Any]) -> dict[str, int | None]:
    """The first and last pipeline stages' layer counts an override section sets, as ParallelLayout's fields."""
    return {"first_stage_layers": overrides.get(STAGE_LAYER_FIELDS[0]),
            "last_stage_layers": overrides.get(STAGE_LAYER_FIELDS[1])}


def _asks(value) -> bool:
    return value is not None and value is not False


def transformer_override_problems(key: str, overrides: dict[str, Any], te_available: bool,
                                  fields: set[str] | None = None) -> list[str]:
    """Problems of `<key>.override_transformer_config`; `fields` are TransformerConfig's (None: not checked)."""
    where = f"{key}.override_transformer_config"
    problems = []
    for name, value in overrides.items():
        if name in MINDSPEED_FIELDS and (fields is None or name not in fields):
            problems.append(f"{where}.{name}: a field of MindSpeed's TransformerConfig (megatron on Ascend NPUs); "
                            "verlx does not support Ascend NPUs yet")
        elif fields is not None and name not in fields:
            problems.append(f"{where}.{name} is not a megatron TransformerConfig field.{did_you_mean(name, fields)}")
        elif name in DERIVED:
            problems.append(f"{where}.{name}: verlx sets it from the model's HF config and the megatron.* keys "
                            f"({key}.tensor_model_parallel_size, ...); set those instead")
        elif name in UNEVEN_PIPELINE and _asks(value):
            problems.append(f"{where}.{name}={value}: verlx splits the layers over pipeline stages evenly or by "
                            "num_layers_in_first/last_pipeline_stage only; remove it")
        elif name in NEEDS_TRANSFORMER_ENGINE and _asks(value) and not te_available:
            problems.append(f"{where}.{name}={value} needs transformer-engine ({NEEDS_TRANSFORMER_ENGINE[name]}), "
                            "which is not installed; install transformer-engine or remove it")
        elif name in NEEDS_DEEPEP and NEEDS_DEEPEP[name] == value and importlib.util.find_spec("deep_ep") is None:
            problems.append(f"{where}.{name}={value} needs DeepEP (deep_ep), which is not installed; use "
                            "moe_token_dispatcher_type=alltoall")
    return problems


def optimizer_override_problems(key: str, overrides: dict[str, Any], te_available: bool,
                                fields: set[str] | None = None) -> list[str]:
    """Problems of `<key>.optim.override_optimizer_config`; `fields` are megatron OptimizerConfig's."""
    where = f"{key}.optim.override_optimizer_config"
    problems = []
    for name, value in overrides.items():
        if fields is not None and name not in fields:
            problems.append(f"{where}.{name} is not a megatron OptimizerConfig field.{did_you_mean(name, fields)}")
        elif name == "optimizer_cpu_offload" and _asks(value):
            problems.append(f"{where}.optimizer_cpu_offload=true: megatron's CPU-offloaded optimizer is not "
                            "supported by verlx's megatron backend; remove it and set megatron.optimizer_offload=true "
                            "(the optimizer state in host memory between phases) instead")
        elif name == "use_precision_aware_optimizer" and _asks(value) and not te_available:
            problems.append(f"{where}.use_precision_aware_optimizer=true needs transformer-engine's FusedAdam, which "
                            "is not installed; install transformer-engine or remove it")
        elif name == "use_distributed_optimizer":
            problems.append(f"{where}.use_distributed_optimizer: set {key}.megatron.use_distributed_optimizer "
                            "instead (the DDP wrapper and the checkpoint format follow it)")
    return problems


def ddp_override_problems(key: str, overrides: dict[str, Any], fields: set[str] | None = None) -> list[str]:
    where = f"{key}.override_ddp_config"
    problems = []
    for name in overrides:
        if fields is not None and name not in fields:
            problems.append(f"{where}.{name} is not a megatron DistributedDataParallelConfig field."
                            f"{did_you_mean(name, fields)}")
        elif name in DDP_KEYS:
            problems.append(f"{where}.{name}: set {key}.{DDP_KEYS[name]} instead")
    return problems


def transformer_kwargs_with_overrides(kwargs: dict[str, Any], overrides: dict[str, Any],
                                      use_te: bool) -> dict[str, Any]:
    """verlx's TransformerConfig kwargs with the user's overrides on top. Null values keep verlx's choice (veRL's
    YAML lists recompute_* as null); attention_backend selects a transformer-engine kernel and is dropped without
    it (verlx's own attention runs torch's scaled_dot_product_attention)."""
    out = dict(kwargs)
    if overrides.get("recompute_granularity") == "selective":  # verlx's full-recompute settings do not apply
        out.pop("recompute_method", None)
        out.pop("recompute_num_layers", None)
    for name, value in overrides.items():
        if value is None:
            continue
        if name == "attention_backend":
            if not use_te:
                continue
            from megatron.core.transformer.enums import AttnBackend

            value = AttnBackend[value] if isinstance(value, str) else value
        out[name] = value
    return out
