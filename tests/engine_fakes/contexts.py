"""A tiny checkpoint and RolloutContext for driving the engine adapters against the fakes."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import torch
from safetensors.torch import save_file

from verlx.config.roles import RolloutConfig
from verlx.protocol import DataProto
from verlx.rollout.base import RolloutContext

SHAPES = {
    "model.embed_tokens.weight": (8, 4),
    "model.layers.0.input_layernorm.weight": (4,),
    "model.layers.0.self_attn.q_proj.weight": (4, 4),
    "model.layers.0.self_attn.k_proj.weight": (2, 4),
    "model.layers.0.self_attn.v_proj.weight": (2, 4),
    "model.layers.0.self_attn.o_proj.weight": (4, 4),
    "model.layers.0.post_attention_layernorm.weight": (4,),
    "model.layers.0.mlp.gate_proj.weight": (6, 4),
    "model.layers.0.mlp.up_proj.weight": (6, 4),
    "model.layers.0.mlp.down_proj.weight": (4, 6),
    "model.norm.weight": (4,),
    "lm_head.weight": (8, 4),
}
EOS, PAD = 2, 0


def trainer_weights(scale: float = 1.0) -> list[tuple[str, torch.Tensor]]:
    """fp32 trainer parameters in checkpoint order, some under FSDP / compile wrapper names."""
    out = []
    for i, (name, shape) in enumerate(SHAPES.items()):
        tensor = torch.full(shape, scale * (i + 1), dtype=torch.float32)
        wrapped = name.replace("model.layers.0.", "model.layers.0._fsdp_wrapped_module.") if "mlp" in name else name
        out.append((wrapped, tensor))
    return out


def write_checkpoint(path: str, tied: bool = False) -> str:
    os.makedirs(path, exist_ok=True)
    names = {n: s for n, s in SHAPES.items() if not (tied and n == "lm_head.weight")}
    save_file({n: torch.zeros(s) for n, s in names.items()}, os.path.join(path, "model.safetensors"))
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump({"model_type": "qwen2", "tie_word_embeddings": tied}, f)
    return path


def make_ctx(path: str, rank: int = 0, world_size: int = 1, tp_size: int = 1, tied: bool = False,
             n_gpus_per_node: int | None = None, **overrides) -> RolloutContext:
    config = RolloutConfig(
        response_length=6, prompt_length=8, dtype="bfloat16", tensor_model_parallel_size=tp_size, seed=5
    )
    for key, value in overrides.items():
        setattr(config, key, value)
    return RolloutContext(
        config=config,
        model_path=write_checkpoint(path, tied),
        hf_config=SimpleNamespace(tie_word_embeddings=tied),
        device=torch.device("cpu"),
        pad_token_id=PAD,
        eos_token_ids=[EOS],
        rank=rank,
        world_size=world_size,
        local_rank=rank,
        tp_size=tp_size,
        n_gpus_per_node=n_gpus_per_node,
    )


def left_padded_prompts(meta_info: dict | None = None) -> DataProto:
    """Two prompts, [5, 6, 7] and [9], left-padded to 4."""
    input_ids = torch.tensor([[PAD, 5, 6, 7], [PAD, PAD, PAD, 9]])
    mask = torch.tensor([[0, 1, 1, 1], [0, 0, 0, 1]])
    position_ids = torch.clamp(torch.cumsum(mask, -1) - 1, min=0)
    return DataProto({"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids},
                     {"uid": ["a", "b"]}, meta_info or {})
