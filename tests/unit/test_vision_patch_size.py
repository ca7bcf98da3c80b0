"""data.image_patch_size (veRL's key; veRL resizes images for it): accepted where it is the vision-language model's
own patch size (Qwen3-VL's 16, Qwen2-VL's 14) and at veRL's default 14 with a warning, refused naming both sizes
otherwise, read from config.json before anything runs; a text model has no images, so its value changes nothing."""

from __future__ import annotations

import pytest

from helpers.tiny_tokenizer import save_tiny_qwen2
from helpers.tiny_vlm import save_tiny_vlm
from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.ranges import PPO_RANGES, range_problems
from verlx.config.schema import PPOConfig
from verlx.trainer.preflight import validate
from verlx.trainer.vision_checks import patch_size_findings


def _config(model: str, *overrides: str) -> PPOConfig:
    return build(PPOConfig, to_container(load_yaml(overrides=["algorithm.adv_estimator=grpo",
                                                              f"actor_rollout_ref.model.path={model}",
                                                              *overrides])))


@pytest.mark.parametrize(("model_type", "own", "other"), [("qwen3_vl", 16, 28), ("qwen2_vl", 14, 16)])
def test_the_models_own_patch_size_passes_and_another_is_refused_naming_both(tmp_path, model_type, own, other):
    model = save_tiny_vlm(tmp_path / "model", model_type)
    for accepted in (f"data.image_patch_size={own}", "data.image_patch_size=null"):  # null: the processor's own
        assert patch_size_findings(_config(model, accepted)) == ([], [])
    assert patch_size_findings(_config(model, f"data.image_patch_size={other}")) == ([
        f"data.image_patch_size={other}: the model's vision encoder uses {own}-pixel patches ({model}/config.json "
        f"vision_config.patch_size) and verlx resizes images with its image processor for those; set "
        f"data.image_patch_size={own} or remove it (resizing for another patch size is not supported)"], [])
    with pytest.raises(ConfigError, match=f"data.image_patch_size={other}: the model's vision encoder"):
        validate(_config(model, f"data.image_patch_size={other}", "actor_rollout_ref.rollout.name=hf"),
                 check_files=False)  # refused by the pre-flight check


def test_verls_default_of_14_on_a_qwen3_vl_model_is_accepted_with_a_warning(tmp_path):
    """veRL's generated configs carry 14 for every model: a YAML of the user's built from one keeps running."""
    model = save_tiny_vlm(tmp_path / "model", "qwen3_vl")
    cfg = _config(model, "data.image_patch_size=14")
    problems, warnings = patch_size_findings(cfg)
    assert problems == []
    assert warnings == [
        f"data.image_patch_size=14 (veRL's default) is not the model's patch size: verlx resizes images for its "
        f"vision encoder's 16-pixel patches ({model}/config.json vision_config.patch_size), as its image processor "
        "does; set data.image_patch_size=16 or remove it to silence this"]
    logged = validate(_config(model, "data.image_patch_size=14", "actor_rollout_ref.rollout.name=hf"),
                      check_files=False)
    assert warnings[0] in logged  # the pre-flight check logs it


def test_a_text_model_ignores_it_and_a_size_below_one_is_refused(tmp_path):
    text = save_tiny_qwen2(tmp_path / "text")
    assert patch_size_findings(_config(text, "data.image_patch_size=16")) == ([], [])
    assert patch_size_findings(_config(text, "data.image_patch_size=14")) == ([], [])
    assert range_problems(_config(text, "data.image_patch_size=0"), PPO_RANGES) == [
        "data.image_patch_size=0 is out of range: it must be >= 1 (pixels)"]
    with pytest.raises(ConfigError, match="data.image_patch_size"):
        _config(text, "data.image_patch_size=abc")
