"""LoRA on the actor (PEFT): adapters only are trained; the reference is the same model with adapters disabled;
rollout engines get merged weights under HF names."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Iterable, Iterator

import torch

logger = logging.getLogger(__name__)
PEFT_PREFIX = "base_model.model."
INSTALL_HINT = "pip install peft"


def peft_available() -> bool:
    return importlib.util.find_spec("peft") is not None


def apply_lora(hf_model, model_cfg):
    """Wrap a HF causal LM with LoRA adapters (fresh, or trainable ones loaded from model.lora_adapter_path)."""
    if not peft_available():
        raise RuntimeError(f"actor_rollout_ref.model.lora_rank={model_cfg.lora_rank} needs peft: {INSTALL_HINT}")
    from peft import LoraConfig, PeftModel, get_peft_model

    if model_cfg.lora_adapter_path:
        return PeftModel.from_pretrained(hf_model, model_cfg.lora_adapter_path, is_trainable=True)
    config = LoraConfig(
        r=model_cfg.lora_rank,
        lora_alpha=model_cfg.lora_alpha,
        target_modules=model_cfg.target_modules,
        exclude_modules=model_cfg.exclude_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    return get_peft_model(hf_model, config)


def is_lora_model(hf_model) -> bool:
    return hasattr(hf_model, "peft_config") and hasattr(hf_model, "disable_adapter")


def lora_scaling(hf_model) -> float:
    config = hf_model.peft_config["default"]
    return config.lora_alpha / config.r


def merged_weights(named_tensors: Iterable[tuple[str, torch.Tensor]], scaling: float
                   ) -> Iterator[tuple[str, torch.Tensor]]:
    """A PEFT model's full (gathered) state dict → HF names, each LoRA layer's weight merged: W + s·B·A.

    PEFT lists a LoRA layer's tensors in module order (base_layer.weight, [base_layer.bias], lora_A, lora_B), so one
    layer's tensors are held at a time.
    """
    pending: dict[str, torch.Tensor] = {}
    for name, tensor in named_tensors:
        name = name.removeprefix(PEFT_PREFIX)
        if ".lora_A." in name:
            pending[name.split(".lora_A.")[0] + ".A"] = tensor
        elif ".lora_B." in name:
            module = name.split(".lora_B.")[0]
            base = pending.pop(module + ".base")
            a = pending.pop(module + ".A")
            delta = (tensor.float() @ a.float()) * scaling
            yield f"{module}.weight", (base.float() + delta).to(base.dtype)
        elif name.endswith(".base_layer.weight"):
            pending[name.removesuffix(".base_layer.weight") + ".base"] = tensor
        elif ".base_layer." in name:
            yield name.replace(".base_layer.", "."), tensor
        elif ".lora_" in name:  # lora_embedding_*, dropout state: not part of the HF checkpoint
            continue
        else:
            yield name, tensor
    if pending:
        raise RuntimeError(f"LoRA merge: incomplete layers {sorted(pending)}")
