"""Prompts with images for SGLang and vLLM (rollout/image_requests.py): the request each engine is given for a tiny
Qwen2-VL batch (hand-computed ids, one image token per image, the images themselves), through the engines' adapters
driven against their recording stand-ins, and the rollout batch that comes back lined up with the batch's prompts."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine_fakes.contexts import EOS, PAD, make_ctx
from engine_fakes.fake_sglang import fake_completion, install_fake_sglang
from engine_fakes.fake_vllm import install_fake_vllm
from helpers.tiny_vlm import random_image
from verlx.batch_columns import MULTI_MODAL_DATA, MULTI_MODAL_INPUTS
from verlx.models.mrope import batch_position_ids
from verlx.models.vision import IMAGE_GRID_THW, PIXEL_VALUES, VisionLanguageModel
from verlx.protocol import DataProto
from verlx.rollout.image_requests import (
    base64_png,
    collapse_image_runs,
    image_prompt,
    sglang_image_data,
    vllm_prompt,
)
from verlx.rollout.sglang_engine import SGLangRolloutEngine
from verlx.rollout.vllm_engine import VLLMRolloutEngine

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


# ---------------------------------------------------------------------- the pure functions
def test_each_image_run_is_cut_to_one_token():
    assert collapse_image_runs(PROMPTS[0], IMG, [4]) == ENGINE_PROMPTS[0]
    assert collapse_image_runs(PROMPTS[2], IMG, [1, 2]) == ENGINE_PROMPTS[2]
    assert collapse_image_runs([9], IMG, []) == [9]


def test_runs_that_are_not_the_images_counts_are_refused():
    with pytest.raises(ValueError, match=r"runs are \[1, 2\] tokens long but its images make \[2, 1\]"):
        collapse_image_runs(PROMPTS[2], IMG, [2, 1])
    with pytest.raises(ValueError, match=r"runs are \[4\] tokens long but its images make \[\]"):
        collapse_image_runs(PROMPTS[0], IMG, [])


def test_a_request_takes_the_rows_images_in_order():
    for ids, grid, images, expected in zip(PROMPTS, GRIDS, IMAGES, ENGINE_PROMPTS):
        prompt, taken = image_prompt(ids, vision_inputs(grid), images, MODEL)
        assert prompt == expected
        assert len(taken) == len(images) and all(a is b for a, b in zip(taken, images))
    with pytest.raises(ValueError, match="the prompt has 1 images .multi_modal_data. but 2 grids"):
        image_prompt(PROMPTS[2], vision_inputs(GRIDS[2]), IMAGES[2][:1], MODEL)
    with pytest.raises(ValueError, match="not a vision-language model"):
        image_prompt(PROMPTS[0], vision_inputs(GRIDS[0]), IMAGES[0], None)


def test_engine_payloads():
    image = IMAGES[0][0]
    assert vllm_prompt([1, 2], []) == {"prompt_token_ids": [1, 2]}
    assert vllm_prompt(ENGINE_PROMPTS[0], [image]) == {"prompt_token_ids": ENGINE_PROMPTS[0],
                                                       "multi_modal_data": {"image": [image]}}
    assert sglang_image_data([], 1) is None
    assert sglang_image_data([image], 1) == [image]
    assert sglang_image_data(IMAGES[2], 3) == [IMAGES[2]]


def test_base64_png_carries_the_same_pixels():
    from PIL import Image

    image = IMAGES[2][1]
    decoded = Image.open(io.BytesIO(base64.b64decode(base64_png(image))))
    assert decoded.size == (56, 28)
    assert np.array_equal(np.asarray(decoded.convert("RGB")), np.asarray(image))


# ---------------------------------------------------------------------- through the engines' adapters
@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    state = install_fake_vllm("0.26.0", str(tmp_path / "dist"))
    yield state
    state.undo()


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    import multiprocessing as mp

    for key in ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"):
        monkeypatch.delenv(key, raising=False)
    start_method = mp.get_start_method(allow_none=True)
    state = install_fake_sglang("0.5.17", str(tmp_path / "dist"))
    yield state
    state.undo()
    mp.set_start_method(start_method, force=True)


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


def test_vllm_takes_each_prompt_with_its_images(fake_vllm, tmp_path):
    engine = VLLMRolloutEngine(vl_ctx(tmp_path, load_format="auto"))
    out = engine.generate(vision_batch({"n": 2}))
    adds = [call for call in fake_vllm.calls if call[0] == "add_request"]
    assert [call[2] for call in adds] == [ids for ids in ENGINE_PROMPTS for _ in range(2)]
    by_id = {call[1]: row for row, call in enumerate(adds)}
    images = {row: fake_vllm.multi_modal_data[request]["image"] for request, row in by_id.items()
              if request in fake_vllm.multi_modal_data}
    assert sorted(images) == [0, 1, 4, 5]  # the text prompt's samples go without multi_modal_data
    for row, taken in images.items():
        assert len(taken) == len(IMAGES[row // 2]) and all(a is b for a, b in zip(taken, IMAGES[row // 2]))
    check_rollout(out, 2)


def test_vllm_keeps_the_tokenizer_of_a_vision_language_model(fake_vllm, tmp_path):
    VLLMRolloutEngine(vl_ctx(tmp_path))
    assert fake_vllm.calls[0][1]["skip_tokenizer_init"] is False


def test_sglang_takes_each_prompt_with_its_images(fake_sglang, tmp_path):
    engine = SGLangRolloutEngine(vl_ctx(tmp_path, load_format="auto"))
    out = engine.generate(vision_batch({"n": 2}))
    requests = [call for call in fake_sglang.calls if call[0] == "async_generate"]
    assert [call[1] for call in requests] == ENGINE_PROMPTS
    first_ids = [call[4][0] for call in requests]
    assert [first in fake_sglang.image_data for first in first_ids] == [True, False, True]
    for row in (0, 2):
        [taken] = fake_sglang.image_data[first_ids[row]]  # n=2: one list of images for the one prompt
        assert len(taken) == len(IMAGES[row]) and all(a is b for a, b in zip(taken, IMAGES[row]))
    check_rollout(out, 2)


def test_sglang_takes_one_samples_images_unwrapped(fake_sglang, tmp_path):
    engine = SGLangRolloutEngine(vl_ctx(tmp_path, load_format="auto"))
    out = engine.generate(vision_batch({"n": 1}))
    requests = [call for call in fake_sglang.calls if call[0] == "async_generate"]
    taken = fake_sglang.image_data[requests[2][4]]
    assert len(taken) == 2 and all(a is b for a, b in zip(taken, IMAGES[2]))
    check_rollout(out, 1)
