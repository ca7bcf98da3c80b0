"""gpu_memory_utilization too small for the weights plus one sequence is refused before the engine allocates."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from verlx.rollout.memory_budget import EngineFootprint, check_budget, engine_footprint, kv_bytes_per_token
from verlx.rollout.weight_sync import checkpoint_numel

GIB = 2**30
QWEN_05B = SimpleNamespace(num_attention_heads=14, num_key_value_heads=2, hidden_size=896, num_hidden_layers=24)


def test_kv_bytes_per_token_of_a_gqa_model():
    assert kv_bytes_per_token(QWEN_05B, 2) == 2 * 24 * 2 * 64 * 2 == 12288
    assert kv_bytes_per_token(QWEN_05B, 2, tp_size=2) == 2 * 24 * 1 * 64 * 2  # one KV head per GPU
    assert kv_bytes_per_token(QWEN_05B, 2, tp_size=4) == 2 * 24 * 1 * 64 * 2  # replicated: fewer heads than GPUs
    assert kv_bytes_per_token(SimpleNamespace(num_attention_heads=4, hidden_size=64, num_hidden_layers=2,
                                              head_dim=32), 4) == 2 * 2 * 4 * 32 * 4


def test_the_refusal_names_every_number():
    footprint = EngineFootprint(weight_bytes=int(0.99 * GIB), kv_bytes_per_token=12288, max_model_len=4096)
    with pytest.raises(ValueError) as info:
        check_budget("sglang", 0.01, 80 * GIB, footprint)
    text = str(info.value)
    assert "gpu_memory_utilization=0.01 gives the sglang engine 0.80 GiB of the GPU's 80.0 GiB" in text
    assert "weights (0.99 GiB) plus the KV cache of one sequence of 4096 tokens (0.05 GiB) = 1.04 GiB" in text
    assert "raise actor_rollout_ref.rollout.gpu_memory_utilization to at least 0.01" in text
    check_budget("sglang", 0.02, 80 * GIB, footprint)  # 1.6 GiB holds 1.04 GiB


def test_parameters_counted_from_the_checkpoint_headers(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert checkpoint_numel(tiny_model_dir) == sum(p.numel() for p in model.parameters())  # tied head stored once
    assert checkpoint_numel(str(tiny_model_dir) + "/missing") is None


def test_a_vision_language_footprint_takes_the_decoder_shape_from_its_text_config():
    """Qwen2-VL's config keeps the decoder's heads and layers in text_config (transformers 5): the KV bytes of a token
    are the decoder's, the vision tower adds none."""
    from transformers import Qwen2VLConfig

    config = Qwen2VLConfig(text_config=dict(num_attention_heads=12, num_key_value_heads=2, hidden_size=1536,
                                            num_hidden_layers=28))
    footprint = engine_footprint(config, numel=2_000_000_000, dtype_bytes=2, tp_size=2, max_model_len=1152)
    assert footprint.kv_bytes_per_token == 2 * 28 * 1 * 128 * 2
    assert footprint.weight_bytes == 2_000_000_000
    assert footprint.max_model_len == 1152
