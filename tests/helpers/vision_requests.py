"""A tiny Qwen2-VL prompt batch with images, as the dataset makes it, for the tests of the engines' requests with
images (SGLang and vLLM against their stand-ins, in process and in server mode), and what the stand-ins answer."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import torch

from engine_fakes.contexts import EOS, PAD, make_ctx
from engine_fakes.fake_sglang import fake_completion
from helpers.tiny_vlm import random_image
from verlx.batch_columns import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS
from verlx.models.mrope import batch_position_ids
from verlx.models.vision import IMAGE_GRID_THW, PIXEL_VALUES, VisionLanguageModel
from verlx.protocol import DataProto

# Qwen2-VL's vision token ids
VS, VE, IMG = 151652, 151653, 151655
MODEL = VisionLanguageModel("qwen2_vl", IMG, 2)
#: row 0: one image of grid (1, 4, 4) = 4 tokens; row 1: text; row 2: images of 1 and 2 tokens
PROMPTS = [[5, VS, IMG, IMG, IMG, IMG, VE, 7], [9], [VS, IMG, VE, VS, IMG, IMG, VE, 8]]
GRIDS = [torch.tensor([[1, 4, 4]]), None, torch.tensor([[1, 2, 2], [1, 2, 4]])]
#: what the engines take: each run of image tokens cut to one
ENGINE_PROMPTS = [[5, VS, IMG, VE, 7], [9], [VS, IMG, VE, VS, IMG, VE, 8]]
IMAGES = [[random_image(56, 56, seed=1)], [], [random_image(28, 28, seed=2), random_image(28, 56, seed=3)]]


def vision_inputs(grid):
    if grid is None:
        return {}
    patches = int(grid.prod(-1).sum())
    return {PIXEL_VALUES: torch.zeros(patches, 3 * 2 * 14 * 14), IMAGE_GRID_THW: grid}


def vision_batch(meta_info: dict | None = None) -> DataProto:
    """The three prompts left-padded to 8, with their vision inputs, images and M-RoPE positions, as the dataset
    makes them."""
    width = max(map(len, PROMPTS))
    input_ids = torch.full((len(PROMPTS), width), PAD)
    mask = torch.zeros_like(input_ids)
    for row, ids in enumerate(PROMPTS):
        input_ids[row, width - len(ids):] = torch.tensor(ids)
        mask[row, width - len(ids):] = 1
    positions = batch_position_ids(input_ids, mask, GRIDS, IMG, 2)
    non_tensor = {MULTI_MODAL_INPUTS: np.array([vision_inputs(g) for g in GRIDS], dtype=object),
                  MULTI_MODAL_DATA: np.array([{"image": im} if im else {} for im in IMAGES], dtype=object)}
    return DataProto({"input_ids": input_ids, "attention_mask": mask, "position_ids": positions}, non_tensor,
                     meta_info or {})


def vl_ctx(tmp_path, **overrides):
    ctx = make_ctx(str(tmp_path / "model"), **overrides)
    ctx.hf_config = SimpleNamespace(tie_word_embeddings=False, model_type="qwen2_vl", image_token_id=IMG,
                                    vision_config=SimpleNamespace(spatial_merge_size=2))
    return ctx


def expected_rows(n: int) -> list[tuple[list[int], list[float]]]:
    """The stand-ins' tokens and log-probs for each engine prompt's samples (stop at EOS, at most 6 tokens)."""
    params = {"max_new_tokens": 6, "stop_token_ids": [EOS]}
    return [fake_completion(ids, s, params)[:2] for ids in ENGINE_PROMPTS for s in range(n)]


def check_rollout(out: DataProto, n: int) -> None:
    """Responses and log-probs in the batch's rows; the prompt part and its positions are the batch's own."""
    batch = vision_batch().repeat(n, interleave=True)
    assert torch.equal(out.batch["prompts"], batch.batch["input_ids"])
    assert torch.equal(out.batch["position_ids"][..., :8], batch.batch["position_ids"])
    for row, (tokens, log_probs) in enumerate(expected_rows(n)):
        k = len(tokens)
        assert out.batch["responses"][row, :k].tolist() == tokens
        assert out.batch["response_mask"][row].tolist() == [1] * k + [0] * (6 - k)
        assert torch.allclose(out.batch["rollout_log_probs"][row, :k], torch.tensor(log_probs))
    # the response continues every M-RoPE axis from the prompt's last position
    last = batch.batch["position_ids"][..., -1:]
    assert torch.equal(out.batch["position_ids"][..., 8:], last + torch.arange(1, 7))
