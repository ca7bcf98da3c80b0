"""Loading HF models for training and sharding them with FSDP2 (`fully_shard`)."""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist
from torch import nn

from verlx.models.attention import register_packed_attention
from verlx.models.hf_config import import_external_lib, load_hf_config
from verlx.models.lora import apply_lora
from verlx.models.policy import PolicyModel, ValueModel, decoder_layers
from verlx.models.score_model import ScoreModel
from verlx.models.vision import causal_lm_class, vision_language_model, vision_tower
from verlx.utils.lr_schedules import optim_lr_multiplier
from verlx.utils.paths import expand_path

logger = logging.getLogger(__name__)


def enable_activation_checkpointing(model) -> None:
    """Non-reentrant checkpointing of every decoder layer (transformers renamed the method in 5.x)."""
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def uses_packing(model_cfg) -> bool:
    return bool(getattr(model_cfg, "use_remove_padding", False))


def attention_for(model_cfg, default: str = "sdpa") -> str:
    """The attn_implementation to load with: our packed varlen attention when use_remove_padding is on."""
    return register_packed_attention() if uses_packing(model_cfg) else default


def _load_hf(auto_class, path: str, model_cfg, master_dtype: torch.dtype, attn_implementation: str, what: str,
             checkpointing: bool = False):
    """`auto_class.from_pretrained` with the model config's overrides and attention, activation checkpointing when
    `checkpointing`; `what` names the config key in the error a failed load raises."""
    import_external_lib(model_cfg.external_lib)
    config = load_hf_config(path, model_cfg.trust_remote_code, model_cfg.override_config)
    try:
        model = auto_class.from_pretrained(
            expand_path(path),
            config=config,
            dtype=master_dtype,
            trust_remote_code=model_cfg.trust_remote_code,
            attn_implementation=attention_for(model_cfg, attn_implementation),
        )
    except Exception as e:
        raise RuntimeError(f"could not load the model from {path!r} ({what}): {e}") from e
    if checkpointing:
        enable_activation_checkpointing(model)
    return model


def load_policy(path: str, model_cfg, master_dtype: torch.dtype, attn_implementation: str = "sdpa",
                sp_group=None, with_lora: bool = False, freeze_vision_tower: bool = False) -> PolicyModel:
    """The HF causal LM (or vision-language model) in `master_dtype`, wrapped for chunked log-probs (packed when
    use_remove_padding), with LoRA adapters when `with_lora` (model.lora_rank > 0); a vision-language model's image
    encoder frozen with `freeze_vision_tower` (actor.freeze_vision_tower)."""
    config = load_hf_config(path, model_cfg.trust_remote_code, model_cfg.override_config)
    hf_model = _load_hf(causal_lm_class(config), path, model_cfg, master_dtype, attn_implementation,
                        "actor_rollout_ref.model.path", model_cfg.enable_gradient_checkpointing)
    vision = vision_language_model(config)
    if freeze_vision_tower and vision is not None:
        vision_tower(hf_model).requires_grad_(False)
    if with_lora:
        hf_model = apply_lora(hf_model, model_cfg)
    return PolicyModel(hf_model, packed=uses_packing(model_cfg), sp_group=sp_group, vision=vision)


def load_value_model(path: str, model_cfg, master_dtype: torch.dtype, attn_implementation: str = "sdpa",
                     sp_group=None) -> ValueModel:
    """The HF decoder of the checkpoint (no lm_head) plus a zero-initialised value head."""
    from transformers import AutoModel

    decoder = _load_hf(AutoModel, path, model_cfg, master_dtype, attn_implementation, "critic.model.path",
                       model_cfg.enable_gradient_checkpointing)
    model = ValueModel(decoder, decoder.config.hidden_size, packed=uses_packing(model_cfg), sp_group=sp_group)
    model.value_head.to(master_dtype)
    return model


def load_score_model(path: str, model_cfg, master_dtype: torch.dtype, attn_implementation: str = "sdpa"
                     ) -> ScoreModel:
    """A HF sequence-classification checkpoint (AutoModelForSequenceClassification, one label) as a ScoreModel."""
    from transformers import AutoModelForSequenceClassification

    hf_model = _load_hf(AutoModelForSequenceClassification, path, model_cfg, master_dtype, attn_implementation,
                        "reward_model.model.path")
    score = getattr(hf_model, "score", None)
    if not isinstance(score, nn.Linear):
        raise ValueError(f"reward_model.model.path={path}: {type(hf_model).__name__} has no linear `score` head; the "
                         "reward model must be a decoder sequence-classification model (Llama, Qwen2, Mistral, "
                         "Gemma ...ForSequenceClassification)")
    return ScoreModel(hf_model.base_model, score, packed=uses_packing(model_cfg))


def compile_for_training(model: nn.Module, enabled: bool, device: torch.device) -> None:
    """torch.compile the decoder layers (and log-prob chunks) when `use_torch_compile` and on a GPU; before FSDP.

    CPU runs stay eager: inductor's C++ builds take minutes on small CPU machines, and CPU runs are for
    correctness (verlx.models.compile is tested on CPU directly).
    """
    if not enabled:
        return
    if device.type != "cuda":
        logger.info("use_torch_compile: not compiling on %s (GPU only)", device.type)
        return
    from verlx.models.compile import compile_model

    compile_model(model)


def apply_fsdp2(
    model: nn.Module,
    device: torch.device,
    param_dtype: torch.dtype,
    reshard_after_forward: bool = True,
    reduce_dtype: torch.dtype = torch.float32,
    cpu_offload: bool = False,
    mesh=None,
    grad_divide_factor: float | None = None,
    mixed_precision_on_cpu: bool = False,
) -> nn.Module:
    """Shard every decoder layer and then the root; mixed precision on GPU, gradients reduced in `reduce_dtype`.

    On the CPU the model computes in fp32 (the tests' exact numbers) unless `mixed_precision_on_cpu`: the megatron
    parity benchmark's CPU mode reproduces the GPU's bf16 rounding with it.
    `reshard_after_forward` applies to the layers. The root (embeddings, final norm, output projection) is never
    resharded after forward: training gathers it again at once for backward, and the worker's Offloader frees it
    after a forward-only pass. Gradients are averaged over the ranks by default; `grad_divide_factor` replaces that
    divisor (Ulysses: the SP ranks of one data shard hold partial gradients that must be summed, so divide by the dp
    size only).
    """
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    model.to(device)
    if not dist.is_initialized():
        return model
    kwargs = {"reshard_after_forward": reshard_after_forward}
    if mesh is not None:
        kwargs["mesh"] = mesh
    if device.type == "cuda" or mixed_precision_on_cpu:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    if cpu_offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    inner = model.hf_model if isinstance(model, PolicyModel) else model.decoder
    units = [*decoder_layers(inner), model]
    for unit in units:
        fully_shard(unit, **{**kwargs, "reshard_after_forward": reshard_after_forward and unit is not model})
    if grad_divide_factor is not None:
        for unit in units:
            if hasattr(unit, "set_gradient_divide_factor"):
                unit.set_gradient_divide_factor(float(grad_divide_factor))
            else:  # older torch names it so
                unit.set_reduce_scatter_divide_factor(float(grad_divide_factor))
            if device.type == "cpu" and hasattr(unit, "set_force_sum_reduction_for_comms"):
                unit.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM: sum, then divide
    return model


def build_optimizer(params, optim_cfg) -> torch.optim.Optimizer:
    """AdamW: the fused kernel when every parameter is on a GPU (one launch per step), else foreach."""
    params = [p for p in params if p.requires_grad]
    fused = bool(params) and all(p.device.type == "cuda" for p in params)
    return torch.optim.AdamW(
        params,
        lr=optim_cfg.lr,
        betas=tuple(optim_cfg.betas),
        weight_decay=optim_cfg.weight_decay,
        **({"fused": True} if fused else {"foreach": True}),
    )


def build_lr_scheduler(optimizer, optim_cfg, total_steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """The optim section's schedule (verlx.utils.lr_schedules) on a torch optimizer."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, optim_lr_multiplier(optim_cfg, total_steps))
