"""A tiny Qwen2-VL for tests: the character-level tokenizer with Qwen2-VL's vision tokens, an image processor whose
images become a few patches, and random weights (seed 0), saved with save_pretrained like a hub checkpoint.

No processor_config.json is written: transformers' Qwen2-VL processor needs torchvision for its video half, which
the CPU test machines lack; verlx builds its prompts from the tokenizer and the image processor alone.
"""

from __future__ import annotations

import io

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
PATCH = 14
MERGE = 2
MIN_PIXELS = (PATCH * MERGE) ** 2  # one merged token
MAX_PIXELS = 16 * MIN_PIXELS


def build_vl_tokenizer():
    tok = build_tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", *VISION_TOKENS]})
    tok.chat_template = VL_CHAT_TEMPLATE
    return tok


def save_tiny_qwen2_vl(path, seed: int = 0, tie_word_embeddings: bool = False, text_shape: dict | None = None,
                       vision_shape: dict | None = None, max_pixels: int = MAX_PIXELS, dtype=None) -> str:
    """Qwen2VLForConditionalGeneration (text: 2 layers, hidden 64, GQA 4/2 heads; vision: 2 blocks of width 32, or
    the given shapes), its tokenizer (chat template with image parts) and image processor (images resized to at
    most `max_pixels`), and a generation config, in `path`."""
    import torch
    from transformers import GenerationConfig, Qwen2VLConfig, Qwen2VLForConditionalGeneration
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    tok = build_vl_tokenizer()
    ids = tok.convert_tokens_to_ids
    im_end = ids("<|im_end|>")
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=32768, bos_token_id=None, eos_token_id=im_end,
                pad_token_id=tok.pad_token_id,
                rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0})
    # in_chans: the hub's Qwen2-VL configs carry it beside transformers 5's in_channels, and SGLang 0.5.17's vision
    # tower reads it (without it its scheduler died on the 2B GPU run of 2026-11-26)
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=4, mlp_ratio=2, patch_size=PATCH,
                  spatial_merge_size=MERGE, temporal_patch_size=2, in_chans=3)
    text.update(text_shape or {})
    vision.update(vision_shape or {})
    config = Qwen2VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                           video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                           vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=tie_word_embeddings)
    torch.manual_seed(seed)
    model = Qwen2VLForConditionalGeneration(config)
    (model.to(dtype) if dtype is not None else model).save_pretrained(path)
    tok.save_pretrained(path)
    Qwen2VLImageProcessorPil(size={"shortest_edge": MIN_PIXELS, "longest_edge": max_pixels}).save_pretrained(path)
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
