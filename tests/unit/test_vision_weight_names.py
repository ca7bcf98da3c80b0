"""A vision-language policy's weights as SGLang and vLLM load them: every parameter of a tiny Qwen2-VL (transformers 5
names: model.language_model.*, model.visual.*) is pushed under its checkpoint name (what transformers itself writes
and what the engines' loaders read from disk: model.*, visual.*), nothing dropped; vLLM reports the names it loaded
as its own Qwen2-VL class names them (language_model.model.*, language_model.lm_head.*, visual.*), and a push is
checked against those. A Qwen3-VL's checkpoint keeps transformers 5's names, and so does its push."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForImageTextToText

from engine_fakes.contexts import EOS, PAD
from helpers.tiny_vlm import save_tiny_vlm
from verlx.config.roles import RolloutConfig
from verlx.models.vision import vision_language_model
from verlx.rollout.base import RolloutContext
from verlx.rollout.sglang_engine import SGLangRolloutEngine
from verlx.rollout.vllm_adapter import unloaded_names, vision_language_param_name
from verlx.rollout.weight_sync import iter_engine_weights

#: vLLM's packed_modules_mapping of Qwen2 (0.26's Qwen2-VL class declares none itself: its language_model does)
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A one-layer, one-block tiny Qwen2-VL: its directory, its transformers model and its checkpoint's names."""
    path = save_tiny_vlm(tmp_path_factory.mktemp("vl_names") / "model", text_shape={"num_hidden_layers": 1},
                              vision_shape={"depth": 1})
    model = AutoModelForImageTextToText.from_pretrained(path)
    with safe_open(f"{path}/model.safetensors", framework="pt") as f:
        stored = set(f.keys())
    return path, model, stored


@pytest.fixture(scope="module")
def tiny_qwen3(tmp_path_factory):
    """The same of a one-layer, one-block tiny Qwen3-VL (one DeepStack merger)."""
    vision = {"depth": 1, "deepstack_visual_indexes": [0]}
    path = save_tiny_vlm(tmp_path_factory.mktemp("vl3_names") / "model", "qwen3_vl",
                         text_shape={"num_hidden_layers": 1}, vision_shape=vision)
    model = AutoModelForImageTextToText.from_pretrained(path)
    with safe_open(f"{path}/model.safetensors", framework="pt") as f:
        stored = set(f.keys())
    return path, model, stored


def checkpoint_weight_name(name: str) -> str:
    """A Qwen2-VL parameter's checkpoint name."""
    return vision_language_model(AutoConfig.for_model("qwen2_vl")).checkpoint_weight_name(name)


def pushed_names(model, tied: bool = False) -> list[str]:
    return [name for name, _ in iter_engine_weights(model.named_parameters(), None, tied,
                                                   rename=vision_language_model(model.config).checkpoint_weight_name)]


def test_every_parameter_is_pushed_under_its_checkpoint_name(tiny):
    _, model, stored = tiny
    names = pushed_names(model)
    assert len(names) == len(stored) == 34
    assert set(names) == stored
    assert {n for n, _ in model.named_parameters()} != stored  # transformers 5 names them otherwise
    assert checkpoint_weight_name("model.language_model.layers.0.mlp.up_proj.weight") == \
        "model.layers.0.mlp.up_proj.weight"
    assert checkpoint_weight_name("model.visual.merger.mlp.0.bias") == "visual.merger.mlp.0.bias"
    assert checkpoint_weight_name("lm_head.weight") == "lm_head.weight"
    assert checkpoint_weight_name("model.layers.0.mlp.up_proj.weight") == "model.layers.0.mlp.up_proj.weight"


def test_a_tied_head_is_not_pushed(tiny):
    _, model, stored = tiny
    assert set(pushed_names(model, tied=True)) == stored - {"lm_head.weight"}


def test_vllm_names_of_the_checkpoint_names(tiny):
    _, model, stored = tiny
    vllm = {name: vision_language_param_name(name) for name in stored}
    assert vllm["lm_head.weight"] == "language_model.lm_head.weight"
    assert vllm["model.embed_tokens.weight"] == "language_model.model.embed_tokens.weight"
    assert vllm["model.norm.weight"] == "language_model.model.norm.weight"
    assert vllm["model.layers.0.self_attn.q_proj.bias"] == "language_model.model.layers.0.self_attn.q_proj.bias"
    assert vllm["visual.blocks.0.attn.qkv.weight"] == "visual.blocks.0.attn.qkv.weight"
    assert vllm["visual.merger.mlp.2.weight"] == "visual.merger.mlp.2.weight"
    assert vllm["visual.patch_embed.proj.weight"] == "visual.patch_embed.proj.weight"
    assert len(set(vllm.values())) == len(stored)  # no two names load into one parameter
    assert all(v.startswith(("language_model.model.", "language_model.lm_head.", "visual.")) for v in vllm.values())
    # transformers 5's own names load into the same parameters (vLLM's mapper takes both layouts)
    for name, _ in model.named_parameters():
        assert vision_language_param_name(name) == vllm[checkpoint_weight_name(name)]


def test_a_vllm_push_is_checked_against_the_names_vllm_loaded(tiny):
    _, _, stored = tiny
    fused = {"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
             "up_proj": "gate_up_proj"}
    loaded = set()
    for name in stored:
        parts = vision_language_param_name(name).split(".")
        loaded.add(".".join(fused.get(part, part) for part in parts))
    sent = sorted(stored)
    assert unloaded_names(sent, loaded, PACKED, vision_language_param_name) == []
    assert unloaded_names(sent, loaded - {"visual.merger.ln_q.weight"}, PACKED,
                          vision_language_param_name) == ["visual.merger.ln_q.weight"]
    assert unloaded_names(sent, loaded - {"language_model.model.layers.0.self_attn.qkv_proj.bias"}, PACKED,
                          vision_language_param_name) == [f"model.layers.0.self_attn.{p}_proj.bias" for p in "kqv"]
    # without the mapping, every text-model parameter (vLLM holds them under language_model) seems unloaded
    assert unloaded_names(sent, loaded, PACKED) == [n for n in sent if not n.startswith("visual.")]


def test_the_fused_parameters_are_found_on_vllms_text_model_inside_the_vision_language_class(tiny):
    """vLLM 0.26's Qwen2VLForConditionalGeneration has no packed_modules_mapping; its `language_model` (a
    Qwen2ForCausalLM) has. Read from the top level only, every q/k/v and gate/up shard of the first GPU push looked
    unloaded ("vllm rejected the weight update of [model.layers.0.self_attn.q_proj.weight, ...]", 2026-11-26)."""
    from verlx.rollout.vllm_weight_receiver import packed_modules_mapping_of

    class TextModel(torch.nn.Module):
        packed_modules_mapping = PACKED

    vision_language = torch.nn.Module()
    vision_language.visual = torch.nn.Linear(2, 2)
    vision_language.language_model = TextModel()
    packed = packed_modules_mapping_of(vision_language)
    assert packed == PACKED
    _, _, stored = tiny
    loaded = {".".join({"q_proj": "qkv_proj", "k_proj": "qkv_proj", "v_proj": "qkv_proj", "gate_proj": "gate_up_proj",
                        "up_proj": "gate_up_proj"}.get(p, p) for p in vision_language_param_name(n).split("."))
              for n in stored}
    assert unloaded_names(sorted(stored), loaded, packed, vision_language_param_name) == []
    assert packed_modules_mapping_of(TextModel()) == PACKED and packed_modules_mapping_of(torch.nn.Linear(2, 2)) == {}


def _sglang_engine(path, hf_config) -> SGLangRolloutEngine:
    """The SGLang stand-in engine over the tiny checkpoint at `path`, reading `hf_config` as the model's config."""
    ctx = RolloutContext(config=RolloutConfig(response_length=6, prompt_length=8, seed=5), model_path=path,
                         hf_config=hf_config, device=torch.device("cpu"), pad_token_id=PAD, eos_token_ids=[EOS])
    return SGLangRolloutEngine(ctx)


def test_sglang_gets_the_checkpoint_names_and_the_push_is_complete(tiny, fake_sglang):
    path, model, stored = tiny
    engine = _sglang_engine(path, AutoConfig.from_pretrained(path))
    assert not engine.residency.weights_current  # load_format dummy: a complete push is needed
    engine.update_weights(model.named_parameters(), version=1)
    sent = [name for call in fake_sglang.calls if call[0] == "update_weights_from_tensor" for name in call[1]]
    assert sorted(sent) == sorted(stored)
    assert engine.residency.weights_current
    received = dict(pair for bucket in fake_sglang.engines[0].received for pair in bucket)
    assert torch.equal(received["visual.patch_embed.proj.weight"],
                       model.model.visual.patch_embed.proj.weight.detach().to(torch.bfloat16))


def test_a_push_under_transformers_names_would_be_incomplete(tiny, fake_sglang):
    """Without the checkpoint layout the engine would be sent names its loader skips (SGLang's Qwen2.5-VL loader
    skips a name it does not know), and the push counts as incomplete."""
    path, model, _ = tiny
    engine = _sglang_engine(path, SimpleNamespace(tie_word_embeddings=False))  # a text model's config: no renaming
    engine.update_weights(model.named_parameters(), version=1)
    assert not engine.residency.weights_current


def test_qwen3_vl_is_pushed_under_transformers_names_which_vllm_maps(tiny_qwen3):
    """vLLM 0.26's Qwen3-VL mapper takes model.visual.*, model.language_model.* and lm_head.* (its checkpoints'
    names); SGLang's Qwen3-VL loader renames model.language_model.* and model.visual.* itself."""
    _, model, stored = tiny_qwen3
    names = pushed_names(model)
    assert len(names) == len(stored) == 41
    assert set(names) == stored == {n for n, _ in model.named_parameters()}
    assert "model.visual.deepstack_merger_list.0.linear_fc1.weight" in stored
    vllm = {name: vision_language_param_name(name) for name in stored}
    assert vllm["lm_head.weight"] == "language_model.lm_head.weight"
    assert vllm["model.language_model.layers.0.self_attn.q_norm.weight"] == \
        "language_model.model.layers.0.self_attn.q_norm.weight"
    assert vllm["model.visual.deepstack_merger_list.0.linear_fc1.weight"] == \
        "visual.deepstack_merger_list.0.linear_fc1.weight"
    assert vllm["model.visual.pos_embed.weight"] == "visual.pos_embed.weight"
    assert len(set(vllm.values())) == len(stored)
    assert all(v.startswith(("language_model.model.", "language_model.lm_head.", "visual.")) for v in vllm.values())


def test_sglang_gets_qwen3_vl_names_unchanged_and_the_push_is_complete(tiny_qwen3, fake_sglang):
    path, model, stored = tiny_qwen3
    engine = _sglang_engine(path, AutoConfig.from_pretrained(path))
    engine.update_weights(model.named_parameters(), version=1)
    sent = [name for call in fake_sglang.calls if call[0] == "update_weights_from_tensor" for name in call[1]]
    assert sorted(sent) == sorted(stored)
    assert engine.residency.weights_current
