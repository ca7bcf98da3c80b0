"""Prompts with images for SGLang and vLLM (rollout/image_requests.py): the request each engine is given for a tiny
Qwen2-VL batch (hand-computed ids, one image token per image, the images themselves), through the engines' adapters
driven against their recording stand-ins, and the rollout batch that comes back lined up with the batch's prompts."""

from __future__ import annotations

import base64
import io
from types import SimpleNamespace

import numpy as np
import pytest

from engine_fakes.fake_vllm import install_fake_vllm
from helpers.vision_requests import (
    ENGINE_PROMPTS,
    GRIDS,
    IMAGES,
    IMG,
    MODEL,
    PROMPTS,
    check_rollout,
    vision_batch,
    vision_inputs,
    vl_ctx,
)
from verlx.rollout.image_requests import (
    base64_png,
    collapse_image_runs,
    image_prompt,
    sglang_image_data,
    vllm_prompt,
)
from verlx.rollout.sglang_engine import SGLangRolloutEngine
from verlx.rollout.vllm_engine import VLLMRolloutEngine


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


def test_vllms_server_stream_refuses_a_prompt_with_images():
    import asyncio

    from verlx.rollout.base import SamplingParams
    from verlx.rollout.stream import StreamLimits
    from verlx.rollout.vllm_engine import VLLMServerStream

    loop = asyncio.new_event_loop()
    try:
        stream = VLLMServerStream(SimpleNamespace(loop=loop), SamplingParams(max_new_tokens=6), StreamLimits(6, 14),
                                  False, "verlx-0-")
        stream.submit_samples(["0"], PROMPTS[0], 6, [1], vision=vision_inputs(GRIDS[0]), images=IMAGES[0])
        with pytest.raises(ValueError, match="vllm in server mode does not take image inputs"):
            stream.step()
    finally:
        loop.close()
