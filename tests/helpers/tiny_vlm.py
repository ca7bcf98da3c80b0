"""A tiny Qwen2-VL or Qwen3-VL for tests: the character-level tokenizer with Qwen2-VL's vision tokens (Qwen3-VL's are
the same), an image processor whose images become a few patches, and random weights (seed 0), saved with
save_pretrained like a hub checkpoint.

No processor_config.json is written: transformers' Qwen2-VL and Qwen3-VL processors need torchvision for their video
half, which the CPU test machines lack; verlx builds its prompts from the tokenizer and the image processor alone.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import numpy as np

from helpers.tiny_tokenizer import build_tiny_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
# Qwen2-VL's chat template, cut to what the tests use: string content, or a list of image and text parts.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
PATCH = 14  # Qwen2-VL's; Qwen3-VL's is 16
MERGE = 2
MIN_PIXELS = (PATCH * MERGE) ** 2  # one merged token
MAX_PIXELS = 16 * MIN_PIXELS


@dataclass(frozen=True)
class TinyArchitecture:
    """A tiny vision-language architecture: its transformers classes, patch size and default shapes."""

    config_class: str
    model_class: str
    patch: int
    text: dict
    vision: dict


#: the text decoders: 2 layers, hidden 64, GQA 4/2 heads of 16 (M-RoPE sections 2+3+3 = 16/2); the vision towers:
#: 2 blocks of width 32. Qwen3-VL's interleaves its M-RoPE sections, learns a 4x4 position grid and adds both
#: blocks' DeepStack features to the first two decoder layers.
TINY_ARCHITECTURES = {
    "qwen2_vl": TinyArchitecture(
        "Qwen2VLConfig", "Qwen2VLForConditionalGeneration", PATCH,
        dict(rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0}),
        # in_chans: the hub's Qwen2-VL configs carry it beside transformers 5's in_channels, and SGLang 0.5.17's
        # vision tower reads it (without it its scheduler died on the 2B GPU run of 2026-11-26)
        dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=PATCH,
             spatial_merge_size=MERGE, temporal_patch_size=2, in_chans=3)),
    "qwen3_vl": TinyArchitecture(
        "Qwen3VLConfig", "Qwen3VLForConditionalGeneration", 16,
        dict(head_dim=16, rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3],
                                           "mrope_interleaved": True, "rope_theta": 10000.0}),
        dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=4, out_hidden_size=64, patch_size=16,
             spatial_merge_size=MERGE, temporal_patch_size=2, num_position_embeddings=16,
             deepstack_visual_indexes=[0, 1])),
}


def build_vl_tokenizer():
    tok = build_tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *VISION_TOKENS]})
    tok.chat_template = VL_CHAT_TEMPLATE
    return tok


def save_tiny_vlm(path, model_type: str = "qwen2_vl", seed: int = 0, tie_word_embeddings: bool = False,
                  text_shape: dict | None = None, vision_shape: dict | None = None, max_pixels: int | None = None,
                  dtype=None) -> str:
    """A tiny model of `model_type` (TINY_ARCHITECTURES, or the given shapes over them), its tokenizer (chat
    template with image parts) and image processor (images resized to at least one merged token, at most
    `max_pixels`: default 16 tokens), and a generation config, in `path`."""
    import torch
    import transformers
    from transformers import GenerationConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    arch = TINY_ARCHITECTURES[model_type]
    tok = build_vl_tokenizer()
    ids = tok.convert_tokens_to_ids
    im_end = ids("<|im_end|>")
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32768, bos_token_id=None, eos_token_id=im_end,
                pad_token_id=tok.pad_token_id, **arch.text)
    text.update(text_shape or {})
    vision = {**arch.vision, **(vision_shape or {})}
    config = getattr(transformers, arch.config_class)(
        text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    model = getattr(transformers, arch.model_class)(config)
    (model.to(dtype) if dtype is not None else model).save_pretrained(path)
    tok.save_pretrained(path)
    one_token = (arch.patch * MERGE) ** 2
    Qwen2VLImageProcessorPil(patch_size=arch.patch, size={"shortest_edge": one_token,
                                                          "longest_edge": max_pixels or 16 * one_token}
                             ).save_pretrained(path)
    GenerationConfig(eos_token_id=[im_end, tok.eos_token_id], pad_token_id=tok.pad_token_id).save_pretrained(path)
    return str(path)


def random_image(height: int, width: int, seed: int):
    """An RGB PIL image of random pixels."""
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def image_tokens(height: int, width: int) -> int:
    """The image-token count of an image the tiny processor keeps at its size (both sides multiples of 28)."""
    return (height // PATCH) * (width // PATCH) // MERGE**2
