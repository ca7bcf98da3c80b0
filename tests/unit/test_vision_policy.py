"""The policy's log-probs on a vision-language model (tiny Qwen2-VL and Qwen3-VL, whose DeepStack features reach the
first decoder layers) against a plain transformers forward of the same model: padded and packed (remove-padding),
with images of different sizes, a row without image, left-padded prompts and right-padded responses; and the
M-RoPE positions against transformers' own get_rope_index."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoImageProcessor, AutoModelForImageTextToText

from helpers.tiny_vlm import random_image, save_tiny_vlm
from verlx.config.roles import ModelConfig, OptimConfig
from verlx.models.mrope import batch_position_ids
from verlx.models.policy import PolicyModel
from verlx.models.vision import micro_batch_vision, vision_language_model, vision_tower
from verlx.workers.fsdp.model_builder import build_optimizer, load_policy

RESPONSE = 5
TEMPERATURE = 0.7
MODEL_TYPES = ["qwen2_vl", "qwen3_vl"]


@pytest.fixture(scope="module", params=MODEL_TYPES)
def tiny_vl(tmp_path_factory, request):
    path = save_tiny_vlm(tmp_path_factory.mktemp("tiny_vl"), request.param)
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    return model, AutoImageProcessor.from_pretrained(path)


def _batch(model, image_processor):
    """Three rows: two images (2x3 and 1x1 merged tokens: 56x84 and 28x28 pixels for Qwen2-VL's 14-pixel patches,
    64x96 and 32x32 for Qwen3-VL's 16), one image (2x2), none; prompts left-padded, responses right-padded (row 1's
    stops after 3 tokens)."""
    image = model.config.image_token_id
    side = image_processor.patch_size * image_processor.merge_size  # the pixels of one merged token
    sizes = [[(2, 3), (1, 1)], [(2, 2)], []]
    rows, vision = [], []
    for i, row_sizes in enumerate(sizes):
        if row_sizes:
            images = [random_image(side * h, side * w, seed=10 * i + j) for j, (h, w) in enumerate(row_sizes)]
            vision.append(dict(image_processor(images=images, return_tensors="pt")))
        else:
            vision.append({})
        counts = [h * w for h, w in row_sizes]
        prompt = [3 + i, 4]
        for n in counts:
            prompt += [image] * n + [5 + i]
        rows.append(prompt)
    width = max(len(r) for r in rows) + 1
    ids = torch.zeros((3, width + RESPONSE), dtype=torch.long)
    mask = torch.zeros_like(ids)
    generator = torch.Generator().manual_seed(0)
    for i, prompt in enumerate(rows):
        ids[i, width - len(prompt):width] = torch.tensor(prompt)
        mask[i, width - len(prompt):width] = 1
        length = 3 if i == 1 else RESPONSE
        ids[i, width:width + length] = torch.randint(10, 60, (length,), generator=generator)
        mask[i, width:width + length] = 1
    return ids, mask, vision


def _hf_log_probs(model, ids, mask, vision):
    """log softmax(logits / T) of the response tokens from the model's own forward (its own M-RoPE positions)."""
    present = [v for v in vision if v]
    image = model.config.image_token_id
    out = model(input_ids=ids, attention_mask=mask, pixel_values=torch.cat([v["pixel_values"] for v in present]),
                image_grid_thw=torch.cat([v["image_grid_thw"] for v in present]),
                mm_token_type_ids=(ids == image).int(), use_cache=False)
    logits = out.logits[:, -RESPONSE - 1:-1].float() / TEMPERATURE
    return torch.log_softmax(logits, -1).gather(-1, ids[:, -RESPONSE:, None]).squeeze(-1)


@pytest.mark.parametrize("packed", [False, True])
def test_policy_log_probs_match_a_plain_forward(tiny_vl, packed):
    model, image_processor = tiny_vl
    spec = vision_language_model(model.config)
    ids, mask, vision = _batch(model, image_processor)
    grids = [v.get("image_grid_thw") for v in vision]
    positions = batch_position_ids(ids, mask, grids, spec.image_token_id, spec.merge_size)
    policy = PolicyModel(model, packed=packed, vision=spec)
    with torch.no_grad():
        log_probs, entropy = policy(ids, mask, positions, RESPONSE, temperature=TEMPERATURE, with_entropy=True,
                                    vision_inputs=micro_batch_vision(vision, ids, spec))
        reference = _hf_log_probs(model, ids, mask, vision)
    response_mask = mask[:, -RESPONSE:].bool()
    assert response_mask.sum() == 13
    torch.testing.assert_close(log_probs[response_mask], reference[response_mask], rtol=0, atol=2e-5)
    assert entropy is not None and entropy.shape == log_probs.shape


def test_deepstack_features_returned_joined_give_the_same_log_probs(tmp_path, monkeypatch):
    """transformers 5.17 (the GPU machine's) returns each DeepStack block's features of all images as one tensor,
    5.24 splits them per image; the policy takes both (a Qwen3-VL run failed on an H100 on 2026-11-27 with the
    split form assumed)."""
    path = save_tiny_vlm(tmp_path, "qwen3_vl")
    model = AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()
    spec = vision_language_model(model.config)
    ids, mask, vision = _batch(model, AutoImageProcessor.from_pretrained(path))
    positions = batch_position_ids(ids, mask, [v.get("image_grid_thw") for v in vision], spec.image_token_id,
                                   spec.merge_size)
    policy = PolicyModel(model, packed=True, vision=spec)

    def log_probs():
        with torch.no_grad():
            return policy(ids, mask, positions, RESPONSE, temperature=TEMPERATURE,
                          vision_inputs=micro_batch_vision(vision, ids, spec))[0]

    split = log_probs()
    split_form = model.model.get_image_features

    def joined_form(*args, **kwargs):
        out = split_form(*args, **kwargs)
        assert all(isinstance(f, tuple) for f in out.deepstack_features)  # 5.24's form, which this test rejoins
        out.deepstack_features = [torch.cat(f) for f in out.deepstack_features]
        return out

    monkeypatch.setattr(model.model, "get_image_features", joined_form)
    torch.testing.assert_close(log_probs(), split, rtol=0, atol=0)


def test_log_probs_depend_on_the_images(tiny_vl):
    """Other pixels give other log-probs: the images reach the text model."""
    model, image_processor = tiny_vl
    spec = vision_language_model(model.config)
    ids, mask, vision = _batch(model, image_processor)
    positions = batch_position_ids(ids, mask, [v.get("image_grid_thw") for v in vision], spec.image_token_id,
                                   spec.merge_size)
    policy = PolicyModel(model, vision=spec)
    changed = [dict(v, pixel_values=v["pixel_values"].flip(0)) if v else v for v in vision]
    with torch.no_grad():
        first, _ = policy(ids, mask, positions, RESPONSE, vision_inputs=micro_batch_vision(vision, ids, spec))
        second, _ = policy(ids, mask, positions, RESPONSE, vision_inputs=micro_batch_vision(changed, ids, spec))
    assert (first[:2] - second[:2]).abs().max() > 1e-3
    torch.testing.assert_close(first[2], second[2], rtol=0, atol=1e-6)  # the row without image


def test_mrope_positions_match_transformers(tiny_vl):
    model, image_processor = tiny_vl
    spec = vision_language_model(model.config)
    ids, mask, vision = _batch(model, image_processor)
    grids = [v.get("image_grid_thw") for v in vision]
    ours = batch_position_ids(ids, mask, grids, spec.image_token_id, spec.merge_size)
    reference, _ = model.model.get_rope_index(ids, (ids == spec.image_token_id).int(),
                                              torch.cat([g for g in grids if g is not None]), attention_mask=mask)
    real = mask.bool()
    assert torch.equal(ours[:, 1:].permute(1, 0, 2)[:, real], reference[:, real])
    assert torch.equal(ours[:, 0][real], (mask.cumsum(-1) - 1)[real])


def test_image_tokens_that_disagree_with_the_grids_are_refused(tiny_vl):
    model, image_processor = tiny_vl
    spec = vision_language_model(model.config)
    ids, mask, vision = _batch(model, image_processor)
    with pytest.raises(ValueError, match="image tokens, but its images' grids make"):
        micro_batch_vision(vision[:1] + [{}, {}], ids, spec)
    with pytest.raises(ValueError, match="no pixel_values"):
        micro_batch_vision(None, ids, spec)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_freeze_vision_tower_trains_the_text_model_only(tmp_path, model_type):
    """actor.freeze_vision_tower: the image encoder (with Qwen3-VL's DeepStack mergers) gets no gradient and keeps its
    weights through an update whose loss depends on the images; the text model's weights move."""
    path = save_tiny_vlm(tmp_path / "model", model_type)
    model_cfg = ModelConfig(path=path, enable_gradient_checkpointing=False, use_remove_padding=True)
    policy = load_policy(path, model_cfg, torch.float32, freeze_vision_tower=True)
    tower = vision_tower(policy.hf_model)
    assert not any(p.requires_grad for p in tower.parameters())
    before = {n: p.detach().clone() for n, p in policy.named_parameters()}
    ids, mask, vision = _batch(policy.hf_model, AutoImageProcessor.from_pretrained(path))
    spec = policy.vision
    positions = batch_position_ids(ids, mask, [v.get("image_grid_thw") for v in vision], spec.image_token_id,
                                   spec.merge_size)
    optimizer = build_optimizer(policy.parameters(), OptimConfig(lr=1e-2))
    log_probs, _ = policy(ids, mask, positions, RESPONSE, vision_inputs=micro_batch_vision(vision, ids, spec))
    log_probs.sum().backward()
    optimizer.step()
    moved = {n for n, p in policy.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all(".visual." not in n for n in moved)
    assert any(".language_model." in n for n in moved)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_training_forward_with_activation_checkpointing_and_compiled_text_layers(tmp_path, model_type):
    """veRL's VL scripts turn on gradient checkpointing and verlx compiles decoder layers on GPUs: the vision-language
    policy trains with checkpointed layers (same log-probs and gradients as without), and compile_model wraps the
    text decoder layers only (image sizes change from batch to batch; the vision blocks stay eager)."""
    from verlx.models.compile import compile_model

    path = save_tiny_vlm(tmp_path / "model", model_type)
    image_processor = AutoImageProcessor.from_pretrained(path)
    grads = []
    for checkpointing in (False, True):
        cfg = ModelConfig(path=path, enable_gradient_checkpointing=checkpointing, use_remove_padding=True)
        policy = load_policy(path, cfg, torch.float32).train()
        assert policy.hf_model.is_activation_checkpointing == checkpointing
        ids, mask, vision = _batch(policy.hf_model, image_processor)
        spec = policy.vision
        positions = batch_position_ids(ids, mask, [v.get("image_grid_thw") for v in vision], spec.image_token_id,
                                       spec.merge_size)
        log_probs, _ = policy(ids, mask, positions, RESPONSE, vision_inputs=micro_batch_vision(vision, ids, spec))
        log_probs.sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=1e-5)
    assert compile_model(policy) == 2  # the two text layers of four blocks (two are the vision tower's)


@pytest.mark.parametrize("packed", [False, True])
def test_an_image_token_in_the_response_is_text(tiny_vl, packed):
    """A policy may sample the image token; transformers' generate embeds it as text at a text position. The policy's
    log-probs of such a response equal the logits generate saw for each forced token (one row, no padding)."""
    model, image_processor = tiny_vl
    spec = vision_language_model(model.config)
    image = spec.image_token_id
    side = image_processor.patch_size * image_processor.merge_size
    vision = dict(image_processor(images=[random_image(2 * side, 2 * side, seed=3)], return_tensors="pt"))
    prompt = torch.tensor([[3, 4] + [image] * 4 + [5, 6]])
    response = torch.tensor([[20, image, 21, image, image]])
    forced = response[0].tolist()
    with torch.no_grad():
        out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), **vision,
                             mm_token_type_ids=(prompt == image).int(), max_new_tokens=RESPONSE, do_sample=False,
                             prefix_allowed_tokens_fn=lambda _, ids: [forced[len(ids) - prompt.shape[1]]],
                             output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=0)
        assert out.sequences[0, prompt.shape[1]:].tolist() == forced
        logits = torch.stack(out.logits, dim=1).float() / TEMPERATURE
        reference = torch.log_softmax(logits, -1).gather(-1, response[..., None]).squeeze(-1)
        ids = torch.cat([prompt, response], dim=1)
        mask = torch.ones_like(ids)
        positions = batch_position_ids(prompt, torch.ones_like(prompt), [vision["image_grid_thw"]], image,
                                       spec.merge_size)
        positions = torch.cat([positions, positions[..., -1:] + torch.arange(1, RESPONSE + 1)], dim=-1)
        log_probs, _ = PolicyModel(model, packed=packed, vision=spec)(
            ids, mask, positions, RESPONSE, temperature=TEMPERATURE,
            vision_inputs=micro_batch_vision([vision], ids, spec, RESPONSE))
    torch.testing.assert_close(log_probs, reference, rtol=0, atol=2e-5)
