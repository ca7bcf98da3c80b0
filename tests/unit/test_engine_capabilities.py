"""What a run needs of its rollout engine is checked before Ray against what the engine's class declares, each
refusal naming the key, the engine and the capability, and listing the engines that have it."""

from __future__ import annotations

import pytest

from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.rollout.capabilities import capability_problems

R = "actor_rollout_ref.rollout"


def problems(*overrides) -> list[str]:
    return capability_problems(build(PPOConfig, to_container(load_yaml(overrides=list(overrides)))))


@pytest.mark.parametrize("engine", ["native", "hf"])
def test_tensor_parallelism_on_an_engine_without_it_is_refused_before_ray(engine):
    cls = {"native": "NativeEngine", "hf": "HFEngine"}[engine]
    assert problems(f"{R}.name={engine}", f"{R}.tensor_model_parallel_size=2") == [
        f"{R}.tensor_model_parallel_size=2 needs a rollout engine that shards a replica over several GPUs, but "
        f"{R}.name={engine} cannot ({cls}.supports_tensor_parallel is False); set it to 1 (each GPU then generates "
        f"its own data-parallel shard) or use {R}.name=sglang or {R}.name=vllm"]


def test_what_every_engine_can_do_is_accepted():
    for engine in ("native", "sglang", "vllm"):
        assert problems(f"{R}.name={engine}", "trainer.partial_rollout=true", f"{R}.multi_turn.enable=true") == []
    for engine in ("sglang", "vllm"):  # in server mode vLLM's tensor-parallel peers are not in lockstep
        assert problems(f"{R}.name={engine}", f"{R}.tensor_model_parallel_size=2", "trainer.partial_rollout=true",
                        f"{R}.server.enable=true", "trainer.n_gpus_per_node=2") == []
    assert problems(f"{R}.name=auto", "trainer.partial_rollout=true") == []  # checked once auto is resolved


def test_vllm_partial_rollout_with_tensor_parallelism_is_refused():
    (problem,) = problems(f"{R}.name=vllm", "trainer.partial_rollout=true", f"{R}.tensor_model_parallel_size=2",
                          "trainer.n_gpus_per_node=2")
    assert problem.startswith(f"trainer.partial_rollout=true with {R}.name=vllm needs {R}.tensor_model_parallel_size=1 "
                              "(got 2)")
    assert problem.endswith(f"break; set {R}.server.enable=true (the group's first rank alone drives the engine's "
                            f"server), or use {R}.name=sglang")


def test_the_alternatives_come_from_the_engines_declarations():
    from verlx.rollout.capabilities import alternatives

    assert alternatives("supports_tensor_parallel") == f"{R}.name=sglang or {R}.name=vllm"
    assert alternatives("supports_partial_rollout") == f"{R}.name=native or {R}.name=sglang or {R}.name=vllm"
    assert alternatives("supports_server") == f"{R}.name=sglang or {R}.name=vllm"


def _model_dir(tmp_path, vision: bool = False, **text) -> str:
    from transformers import Qwen2Config, Qwen2VLConfig

    text = {"max_position_embeddings": 1024, **text}
    config = Qwen2VLConfig(text_config=text) if vision else Qwen2Config(**text)
    config.save_pretrained(tmp_path)
    return str(tmp_path)


def context_problems(model: str, *overrides, name: str | None = None) -> list[str]:
    from verlx.rollout.capabilities import model_config_problems

    cfg = build(PPOConfig, to_container(load_yaml(overrides=[f"actor_rollout_ref.model.path={model}", *overrides])))
    return model_config_problems(cfg, name)


@pytest.mark.parametrize("vision", [False, True])
def test_a_context_beyond_the_models_positions_is_refused_for_vllm_before_ray(tmp_path, vision):
    model = _model_dir(tmp_path, vision=vision)  # a vision-language config keeps the limit in text_config
    assert context_problems(model, f"{R}.name=vllm", "data.max_prompt_length=1024",
                            "data.max_response_length=128") == [
        "data.max_prompt_length + data.max_response_length = 1024 + 128 = 1152 tokens exceeds the model's "
        f"max_position_embeddings=1024 in {model}/config.json, and {R}.name=vllm refuses a longer context: shorten "
        "the prompts or responses, use a model (or a rope_scaling) made for longer sequences, or set "
        "VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 if positions beyond 1024 are what you want"]


def test_sglang_counts_the_two_tokens_its_context_needs_beyond_the_longest_sequence(tmp_path):
    model = _model_dir(tmp_path)
    fits = [f"{R}.name=sglang", "data.max_prompt_length=1000", "data.max_response_length=22"]
    assert context_problems(model, *fits) == []
    (problem,) = context_problems(model, f"{R}.name=sglang", "data.max_prompt_length=1000",
                                  "data.max_response_length=24")
    assert problem.startswith("data.max_prompt_length + data.max_response_length = 1000 + 24 = 1024 tokens (+ 2 "
                              "tokens sglang needs beyond the longest sequence) exceeds the model's "
                              "max_position_embeddings=1024")
    assert problem.endswith("set SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 if positions beyond 1024 are what you "
                            "want")
    (problem,) = context_problems(model, f"{R}.max_model_len=2048", name="sglang")  # `auto` resolved to sglang
    assert problem.startswith(f"{R}.max_model_len=2048 (+ 2 tokens")


def test_engines_without_a_context_limit_rope_scaling_and_the_engines_own_override_pass(tmp_path, monkeypatch):
    long = ["data.max_prompt_length=1024", "data.max_response_length=128"]
    model = _model_dir(tmp_path / "plain")
    for engine in ("native", "hf", "auto"):
        assert context_problems(model, f"{R}.name={engine}", *long) == []
    scaled = _model_dir(tmp_path / "yarn", rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6,
                                                             "original_max_position_embeddings": 1024})
    assert context_problems(scaled, f"{R}.name=vllm", *long) == []
    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    assert context_problems(model, f"{R}.name=vllm", *long) == []
    assert context_problems(str(tmp_path / "missing"), f"{R}.name=sglang", *long) == []  # a hub id: checked later


def test_sglang_refuses_a_qwen2_vl_config_without_in_chans_before_ray(tmp_path):
    """SGLang 0.5.17's Qwen2-VL reads vision_config.in_chans; transformers 5 writes in_channels only (the 2B GPU run
    of 2026-11-26 died in SGLang's scheduler on it)."""
    fresh = _model_dir(tmp_path / "fresh", vision=True, max_position_embeddings=32768)  # transformers 5: no in_chans
    assert context_problems(fresh, f"{R}.name=sglang") == [
        f"actor_rollout_ref.model.path: {fresh}/config.json has no \"in_chans\" in its vision_config, which SGLang's "
        "Qwen2-VL reads: add \"in_chans\": 3 beside \"in_channels\" (the hub's Qwen2-VL configs have both); "
        f"{R}.name=sglang cannot load it otherwise"]
    assert context_problems(fresh, f"{R}.name=vllm") == []
    from transformers import Qwen2VLConfig

    Qwen2VLConfig(text_config={"max_position_embeddings": 32768}, vision_config={"in_chans": 3}).save_pretrained(
        tmp_path / "hub")
    assert context_problems(str(tmp_path / "hub"), f"{R}.name=sglang") == []


def test_sglang_takes_a_qwen3_vl_config_written_by_transformers(tmp_path):
    """SGLang 0.5.17's Qwen3-VL vision tower reads vision_config.in_channels, which transformers 5 writes."""
    from transformers import Qwen3VLConfig

    Qwen3VLConfig(text_config={"max_position_embeddings": 32768}).save_pretrained(tmp_path)
    assert context_problems(str(tmp_path), f"{R}.name=sglang") == []
