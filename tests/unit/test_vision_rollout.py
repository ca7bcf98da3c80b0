"""Rollout of a vision-language model (tiny Qwen2-VL, tiny Qwen3-VL) with the hf engine, from a real parquet file's
rows with images: greedy responses equal transformers' own generate of each prompt alone, the batch's M-RoPE
positions continue through the response, and the engine's log-probs equal the trainer policy's on the rollout batch.
Engines without image input are refused before Ray, naming the engine and the capability."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, AutoModelForImageTextToText, AutoTokenizer

from helpers.tiny_vlm import png_bytes, random_image, save_tiny_vlm
from verlx.batch_columns import MULTI_MODAL_INPUTS
from verlx.config.roles import RolloutConfig
from verlx.config.run import DataConfig
from verlx.config.schema import PPOConfig
from verlx.data import RLHFDataset, write_parquet_atomic
from verlx.data.vision_prompts import load_image_prompts
from verlx.models.mrope import batch_position_ids
from verlx.models.policy import PolicyModel
from verlx.models.vision import micro_batch_vision, vision_language_model
from verlx.rollout.base import RolloutContext
from verlx.rollout.capabilities import capability_problems
from verlx.rollout.hf_engine import HFEngine
from verlx.workers.tokenizer import stop_token_ids

PROMPT, RESPONSE = 48, 6


@pytest.fixture(scope="module", params=["qwen2_vl", "qwen3_vl"])
def setup(tmp_path_factory, request):
    tmp = tmp_path_factory.mktemp("vl_rollout")
    path = save_tiny_vlm(tmp / "model", request.param)
    tokenizer = AutoTokenizer.from_pretrained(path)
    hf_config = AutoConfig.from_pretrained(path)
    image = {"bytes": png_bytes(random_image(56, 84, seed=1)), "path": None}
    small = {"bytes": png_bytes(random_image(28, 56, seed=2)), "path": None}
    rows = [{"data_source": "geo", "prompt": [{"role": "user", "content": text}], "images": images}
            for text, images in [("<image>Find x.", [image]), ("What is 2+2?", []), ("A <image> B <image>",
                                                                                     [small, image])]]
    file = write_parquet_atomic(rows, tmp / "geo.parquet")
    dataset = RLHFDataset(file, tokenizer, DataConfig(max_prompt_length=PROMPT),
                          processor=load_image_prompts(path, hf_config))
    return path, tokenizer, hf_config, dataset


def _engine(path, tokenizer, hf_config):
    config = RolloutConfig(name="hf", prompt_length=PROMPT, response_length=RESPONSE, dtype="float32",
                           load_format="auto", calculate_log_probs=True)
    ctx = RolloutContext(config=config, model_path=path, hf_config=hf_config, device=torch.device("cpu"),
                         pad_token_id=tokenizer.pad_token_id, eos_token_ids=stop_token_ids(tokenizer, path))
    return HFEngine(ctx)


def test_hf_engine_generates_from_images_like_transformers(setup):
    path, tokenizer, hf_config, dataset = setup
    engine = _engine(path, tokenizer, hf_config)
    prompts = dataset.get_batch([0, 1, 2])
    prompts.meta_info.update(do_sample=False, n=2, max_new_tokens=RESPONSE)
    out = engine.generate(prompts)
    assert len(out) == 6 and out.non_tensor_batch[MULTI_MODAL_INPUTS][4] is prompts.non_tensor_batch[
        MULTI_MODAL_INPUTS][2]

    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    spec = vision_language_model(hf_config)
    for row in range(3):
        mask = prompts.batch["attention_mask"][row].bool()
        ids = prompts.batch["input_ids"][row][mask][None]
        vision = prompts.non_tensor_batch[MULTI_MODAL_INPUTS][row]
        kwargs = dict(vision, mm_token_type_ids=(ids == spec.image_token_id).int()) if vision else {}
        alone = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                               max_new_tokens=RESPONSE, eos_token_id=stop_token_ids(tokenizer, path),
                               pad_token_id=tokenizer.pad_token_id, **kwargs)[0, ids.shape[1]:].tolist()
        for sample in (2 * row, 2 * row + 1):
            length = int(out.batch["response_mask"][sample].sum())
            assert out.batch["responses"][sample, :length].tolist() == alone[:length]
            assert length == len(alone)

    # the rollout batch's positions: prompt and response of each row, as if computed on the whole sequence
    grids = [v.get("image_grid_thw") for v in out.non_tensor_batch[MULTI_MODAL_INPUTS]]
    whole = batch_position_ids(out.batch["input_ids"], out.batch["attention_mask"], grids, spec.image_token_id,
                               spec.merge_size)
    real = out.batch["attention_mask"].bool()
    assert out.batch["position_ids"].shape == (6, 4, PROMPT + RESPONSE)
    assert torch.equal(out.batch["position_ids"].permute(1, 0, 2)[:, real], whole.permute(1, 0, 2)[:, real])

    # the engine's log-probs are the trainer policy's on the same batch
    policy = PolicyModel(model, vision=spec)
    with torch.no_grad():
        trainer, _ = policy(out.batch["input_ids"], out.batch["attention_mask"], out.batch["position_ids"],
                            RESPONSE, vision_inputs=micro_batch_vision(out.non_tensor_batch[MULTI_MODAL_INPUTS],
                                                                       out.batch["input_ids"], spec))
    response_mask = out.batch["response_mask"].bool()
    torch.testing.assert_close(out.batch["rollout_log_probs"][response_mask], trainer[response_mask], rtol=0,
                               atol=2e-5)


def test_the_native_engine_is_refused_before_ray_naming_the_key(setup):
    cfg = PPOConfig()
    cfg.actor_rollout_ref.model.path = setup[0]
    cfg.actor_rollout_ref.rollout.name = "native"
    problems = capability_problems(cfg)
    assert len(problems) == 1
    assert (f"actor_rollout_ref.model.path (a vision-language model, {setup[2].model_type}) needs a rollout engine "
            "that takes image inputs") in problems[0]
    assert "actor_rollout_ref.rollout.name=native cannot" in problems[0]
    assert ("supports_image_input is False); use actor_rollout_ref.rollout.name=hf or actor_rollout_ref.rollout."
            "name=sglang or actor_rollout_ref.rollout.name=vllm") in problems[0]


@pytest.mark.parametrize("engine", ["hf", "sglang", "vllm"])
def test_engines_with_image_input_pass(setup, engine):
    cfg = PPOConfig()
    cfg.actor_rollout_ref.model.path = setup[0]
    cfg.actor_rollout_ref.rollout.name = engine
    assert capability_problems(cfg) == []


def test_server_mode_takes_images_on_sglang_only(setup):
    cfg = PPOConfig()
    cfg.actor_rollout_ref.model.path = setup[0]
    cfg.actor_rollout_ref.rollout.server.enable = True
    cfg.actor_rollout_ref.rollout.name = "sglang"
    assert capability_problems(cfg) == []
    cfg.actor_rollout_ref.rollout.name = "vllm"
    problems = capability_problems(cfg)
    assert len(problems) == 1
    assert problems[0] == (
        f"actor_rollout_ref.model.path (a vision-language model, {setup[2].model_type}) with "
        "actor_rollout_ref.rollout.server.enable=true needs a rollout engine that takes image inputs in server mode "
        "(vLLM's server mode does not support them), but actor_rollout_ref.rollout.name=vllm cannot "
        "(VLLMRolloutEngine.supports_server_image_input is False); use "
        "actor_rollout_ref.rollout.name=sglang")
