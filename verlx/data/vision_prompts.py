"""Vision-language prompts: a row's images (the column data.image_key) at the `<image>` placeholders of its messages.

veRL's geo3k preprocessing writes the images as a list of {"bytes": ...} (or {"path": ...}, or paths) and puts one
`<image>` in the message text per image, in order. At load every image is decoded once (a file that cannot be
decoded is refused naming the file, row and key) and its size gives its token count (the image processor's resize
rule): the chat template renders one image token per image, which is expanded here to the image's count, so prompt
lengths, the overlong filter and the rollout see the real sequence. The pixels are made per batch
(`ImagePrompts.vision_inputs`), for the rows of that batch only.

The processor: the tokenizer and the model directory's image processor (transformers' AutoImageProcessor) with the
model's image token; transformers' full Qwen2-VL processor is accepted too (veRL passes one), of which the image
processor is used.
"""

from __future__ import annotations

import io
import os
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from verlx.config.loader import DataError
from verlx.models.mrope import image_token_counts
from verlx.models.vision import IMAGE_GRID_THW, PIXEL_VALUES, VisionLanguageModel, vision_language_model
from verlx.utils.paths import expand_path

IMAGE_PLACEHOLDER = "<image>"
#: placeholders of inputs verlx does not take yet
UNSUPPORTED_PLACEHOLDERS = {"<video>": "video inputs", "<audio>": "audio inputs"}
_SEGMENTS = re.compile(f"({re.escape(IMAGE_PLACEHOLDER)})")


@dataclass
class ImagePrompts:
    """The image half of a vision-language model's processor: token counts, pixels and the model's image token."""

    image_processor: Any
    model: VisionLanguageModel

    def tokens_per_image(self, height: int, width: int) -> int:
        patches = self.image_processor.get_number_of_image_patches(height, width, {})
        return int(patches) // self.model.merge_size**2

    def vision_inputs(self, images: list) -> dict[str, torch.Tensor]:
        """pixel_values and image_grid_thw of one row's decoded images (an empty dict without image)."""
        if not images:
            return {}
        out = self.image_processor(images=images, return_tensors="pt")
        return {PIXEL_VALUES: out[PIXEL_VALUES], IMAGE_GRID_THW: out[IMAGE_GRID_THW]}


def load_image_prompts(model_path: str, hf_config, trust_remote_code: bool = False) -> ImagePrompts | None:
    """The ImagePrompts of a vision-language checkpoint (None for a text model): its AutoImageProcessor."""
    model = vision_language_model(hf_config)
    if model is None:
        return None
    from transformers import AutoImageProcessor

    try:
        image_processor = AutoImageProcessor.from_pretrained(expand_path(model_path),
                                                             trust_remote_code=trust_remote_code)
    except Exception as e:
        raise DataError(f"actor_rollout_ref.model.path={model_path} is a vision-language model ({model.model_type}) "
                        f"but its image processor (preprocessor_config.json) could not be loaded: {e}") from e
    return ImagePrompts(image_processor, model)


def as_image_prompts(processor, tokenizer) -> ImagePrompts:
    """ImagePrompts from what a caller passes as RLHFDataset's `processor`: verlx's own, or transformers'
    processor of a Qwen2-VL model (veRL's)."""
    if isinstance(processor, ImagePrompts):
        return processor
    image_processor = getattr(processor, "image_processor", None)
    image_token_id = getattr(processor, "image_token_id", None)
    if image_processor is None or image_token_id is None:
        raise ValueError(f"RLHFDataset: the processor {type(processor).__name__} has no image processor and image "
                         "token; pass verlx.data.vision_prompts.load_image_prompts(model_path, hf_config)")
    spec = VisionLanguageModel(type(processor).__name__, int(image_token_id), int(image_processor.merge_size))
    return ImagePrompts(image_processor, spec)


def decode_image(value: Any):
    """A PIL RGB image from a cell of the image column: {"bytes": ...}, {"path": ...}, raw bytes, a path, or a PIL
    image. Raises ValueError saying what could not be read."""
    from PIL import Image

    if isinstance(value, Image.Image):
        image = value
    else:
        if isinstance(value, dict):
            value = value.get("bytes") or value.get("path") or value.get("image")
        if isinstance(value, (bytes, bytearray)):
            source: Any = io.BytesIO(value)
        elif isinstance(value, (str, os.PathLike)):
            source = expand_path(os.fspath(value))
        else:
            raise ValueError(f"expected {{'bytes': ...}}, {{'path': ...}}, bytes or a path, got {type(value).__name__}")
        try:
            image = Image.open(source)
            image.load()
        except Exception as e:  # PIL raises many kinds (UnidentifiedImageError, OSError, SyntaxError...)
            raise ValueError(f"cannot be decoded ({type(e).__name__}: {e})") from None
    return image.convert("RGB")


def row_images(cell: Any) -> list:
    """The image column's cell of a row as a list (None and NaN: no image)."""
    if cell is None or (isinstance(cell, float) and np.isnan(cell)):
        return []
    if isinstance(cell, (list, tuple, np.ndarray)):
        return list(cell)
    return [cell]


def image_messages(messages: list[dict]) -> tuple[list[dict], int]:
    """The messages with each `<image>` of a text turned into an image part ({"type": "image"}), and how many
    placeholders there were. Raises ValueError for a placeholder of an input verlx does not take."""
    out, count = [], 0
    for message in messages:
        content = message["content"]
        for placeholder, what in UNSUPPORTED_PLACEHOLDERS.items():
            if placeholder in content:
                raise ValueError(f"the prompt has a {placeholder} placeholder: verlx does not support {what} yet")
        if IMAGE_PLACEHOLDER not in content:
            out.append(message)
            continue
        parts = []
        for segment in _SEGMENTS.split(content):
            if segment == IMAGE_PLACEHOLDER:
                parts.append({"type": "image"})
                count += 1
            elif segment:
                parts.append({"type": "text", "text": segment})
        out.append({**message, "content": parts})
    return out, count


def checked_row_images(cell: Any, messages: list[dict], where: str) -> tuple[list[dict], list[tuple[int, int]]]:
    """A row's messages with image parts and the (height, width) of each of its images, all decoded once; DataError
    naming `where` (file, row, key) for an image that cannot be decoded or placeholders that do not match."""
    images = row_images(cell)
    try:
        converted, placeholders = image_messages(messages)
    except ValueError as e:
        raise DataError(f"{where}: {e}") from None
    if placeholders != len(images):
        raise DataError(f"{where}: the prompt has {placeholders} {IMAGE_PLACEHOLDER} placeholders but the row has "
                        f"{len(images)} images; put one {IMAGE_PLACEHOLDER} in the message text per image, in order")
    sizes = []
    for i, value in enumerate(images):
        try:
            image = decode_image(value)
        except ValueError as e:
            raise DataError(f"{where}: image {i} {e}") from None
        sizes.append((image.height, image.width))
    return converted, sizes


def expand_image_tokens(ids: list[int], counts: list[int], image_token_id: int, where: str) -> list[int]:
    """The rendered prompt's single image token per image repeated to that image's token count."""
    tokens = np.asarray(ids, dtype=np.int64)
    is_image = tokens == image_token_id
    if int(is_image.sum()) != len(counts):
        raise DataError(f"{where}: the chat template rendered {int(is_image.sum())} image tokens for {len(counts)} "
                        "images; the model's chat template must render one image token per image part")
    repeats = np.ones(len(tokens), dtype=np.int64)
    repeats[is_image] = counts
    return np.repeat(tokens, repeats).tolist()


def checked_vision_inputs(prompts: ImagePrompts, images: list, input_ids: torch.Tensor, where: str
                          ) -> dict[str, torch.Tensor]:
    """One row's vision inputs from its decoded images, checked against its image tokens (the image processor must
    resize as it counted)."""
    inputs = prompts.vision_inputs(images)
    expected = int(image_token_counts(inputs[IMAGE_GRID_THW], prompts.model.merge_size).sum()) if inputs else 0
    found = int((input_ids == prompts.model.image_token_id).sum())
    if found != expected:
        raise DataError(f"{where}: the prompt has {found} image tokens but the image processor made {expected} for "
                        "its images")
    return inputs
