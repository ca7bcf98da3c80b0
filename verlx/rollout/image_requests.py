"""Requests with images for the engines that process images themselves (SGLang, vLLM), as pure functions.

verlx's batch holds a prompt with each image's token run expanded to the image's token count (the dataset does it
at load, so lengths, filters and the trainer's M-RoPE positions see the real sequence). Both engines want one image
token per image instead and expand it themselves from the image they are given, with the checkpoint's own image
processor (the same preprocessor_config.json the dataset used, so the same count):
- vLLM (0.26.0): `TokensPrompt(prompt_token_ids=..., multi_modal_data={"image": [PIL images]})`; Qwen2-VL's prompt
  replacement turns each `<|image_pad|>` into that image's run.
- SGLang (0.5.17): `input_ids` with `image_data`; its Qwen-VL processor keeps the caller's tokens and expands the
  i-th image token to the i-th image's count (SGLANG_MM_AVOID_RETOKENIZE, on by default: with runs already
  expanded it would decode the prompt to text and tokenize it again instead).
The engine's prompt is then the batch's again; it returns only the generated tokens (and their log-probs), which
follow the batch's prompt, whose M-RoPE positions verlx computed itself.
"""

from __future__ import annotations

import base64
import io

import numpy as np
import torch

from verlx.models.mrope import image_token_counts
from verlx.models.vision import IMAGE_GRID_THW, VisionLanguageModel


def collapse_image_runs(prompt_ids: list[int], image_token_id: int, counts: list[int]) -> list[int]:
    """The prompt with each run of image tokens cut to its first token; the runs must be the images' token
    `counts`, in order (else the engine's expansion would not be the batch's prompt)."""
    tokens = np.asarray(prompt_ids, dtype=np.int64)
    is_image = tokens == image_token_id
    starts = is_image.copy()
    starts[1:] &= ~is_image[:-1]
    ends = is_image.copy()
    ends[:-1] &= ~is_image[1:]
    runs = (np.flatnonzero(ends) - np.flatnonzero(starts) + 1).tolist()
    if runs != list(counts):
        raise ValueError(f"the prompt's image token runs are {runs} tokens long but its images make {list(counts)}; "
                         "the prompt and its images (multi_modal_data, multi_modal_inputs) do not belong together")
    return tokens[~is_image | starts].tolist()


def image_prompt(prompt_ids: list[int], vision: dict | None, images: list | None,
                 model: VisionLanguageModel | None) -> tuple[list[int], list]:
    """(the prompt ids an engine takes, the images that go with them) of one request: a text prompt unchanged with
    no image; a prompt with images with one image token per image."""
    images = list(images or [])
    grids = (vision or {}).get(IMAGE_GRID_THW)
    if not images and grids is None:
        return list(prompt_ids), []
    if model is None:
        raise ValueError("the prompt has images, but the model is not a vision-language model")
    if grids is None or len(grids) != len(images):
        got = "no image_grid_thw" if grids is None else f"{len(grids)} grids"
        raise ValueError(f"the prompt has {len(images)} images (multi_modal_data) but {got} (multi_modal_inputs)")
    counts = image_token_counts(torch.as_tensor(grids), model.merge_size).tolist()
    return collapse_image_runs(prompt_ids, model.image_token_id, counts), images


def vllm_prompt(prompt_ids: list[int], images: list) -> dict:
    """The fields of vllm.inputs.TokensPrompt for one request: the ids, and the images as multi_modal_data."""
    if not images:
        return {"prompt_token_ids": prompt_ids}
    return {"prompt_token_ids": prompt_ids, "multi_modal_data": {"image": images}}


def sglang_image_data(images: list, samples: int) -> list | None:
    """A request's image_data: its images for one sample; wrapped once more for n > 1 samples (SGLang turns a
    request with n samples into a batch of one prompt, whose image_data is one list per prompt)."""
    if not images:
        return None
    return [list(images)] if samples > 1 else list(images)


def base64_png(image) -> str:
    """An image as the base64 text SGLang's HTTP server takes (lossless: the server decodes the same pixels)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return base64.b64encode(buffer.getvalue()).decode()
