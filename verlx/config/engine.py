"""Typed configs of the training engines: model loading, FSDP2, megatron, optimizer, checkpoint contents."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class WrapPolicyConfig:
    min_num_params: int = 0


@dataclass
class FSDPConfig:
    param_offload: bool = False
    optimizer_offload: bool = False
    offload_policy: bool = False
    reshard_after_forward: bool = True
    defer_grad_reduce: bool = False
    fsdp_size: int = -1
    forward_prefetch: bool = False
    model_dtype: str = "fp32"
    dtype: str = "bfloat16"
    reduce_dtype: str = "fp32"
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)


@dataclass
class RefFSDPConfig:
    param_offload: bool = False
    reshard_after_forward: bool = True
    dtype: str = "bfloat16"
    model_dtype: str = "fp32"
    wrap_policy: WrapPolicyConfig = field(default_factory=WrapPolicyConfig)


@dataclass
class MegatronConfig:
    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    context_parallel_size: int = 1
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = True
    use_distributed_optimizer: bool = True
    param_offload: bool = False
    grad_offload: bool = False
    optimizer_offload: bool = False
    use_transformer_engine: bool | str = "auto"  # auto, true or false
    seed: int = 42
    dtype: str = "bfloat16"
    expert_tensor_parallel_size: int | None = None
    use_dist_checkpointing: bool = False
    dist_checkpointing_path: str | None = None
    override_transformer_config: dict[str, Any] = field(default_factory=dict)
    override_ddp_config: dict[str, Any] = field(default_factory=dict)
    use_mbridge: bool = True
    vanilla_mbridge: bool = False


@dataclass
class OptimConfig:
    optimizer: str = "AdamW"
    lr: float = 1e-6
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    total_training_steps: int = -1
    weight_decay: float = 0.01
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_scheduler_type: str = "constant"
    warmup_style: str | None = None
    min_lr_ratio: float = 0.0
    num_cycles: float = 0.5
    clip_grad: float | None = None
    # megatron-core's parameter scheduler (veRL's megatron optim keys): used when lr_decay_style is set
    lr_decay_style: str | None = None
    lr_decay_steps: int | None = None
    lr_warmup_init: float = 0.0
    min_lr: float = 0.0
    weight_decay_incr_style: str = "constant"
    lr_wsd_decay_style: str = "exponential"
    lr_wsd_decay_steps: int | None = None
    use_checkpoint_opt_param_scheduler: bool = False
    override_optimizer_config: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckpointConfig:
    save_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    load_contents: list[str] = field(default_factory=lambda: ["model", "optimizer", "extra"])
    async_save: bool = False


@dataclass
class ModelConfig:
    path: str = "~/models/Qwen2.5-0.5B-Instruct"
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    external_lib: str | None = None
    override_config: dict[str, Any] = field(default_factory=dict)
    custom_chat_template: str | None = None
    enable_gradient_checkpointing: bool | None = None
    enable_activation_offload: bool = False
    use_remove_padding: bool = True
    use_fused_kernels: bool = True
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: str | list[str] = "all-linear"
    exclude_modules: str | list[str] | None = None
    lora_adapter_path: str | None = None
    use_shm: bool = False


@dataclass
class CriticModelConfig:
    path: str | None = None
    tokenizer_path: str | None = None
    override_config: dict[str, Any] = field(default_factory=dict)
    external_lib: str | None = None
    trust_remote_code: bool = False
    enable_gradient_checkpointing: bool | None = None
    enable_activation_offload: bool = False
    use_remove_padding: bool = True
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: str | list[str] = "all-linear"
    use_shm: bool = False
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
