"""VLLMRolloutEngine driven against a recording stand-in of vLLM's documented LLM API: arguments and
environment, sleep levels, in-place loading with name checks, prefix-cache resets and refusals."""

from __future__ import annotations

import os

import pytest
import torch

from engine_fakes.contexts import EOS, left_padded_prompts, make_ctx, trainer_weights
from engine_fakes.fake_vllm import KV_CACHE_BYTES, RequestOutputKind, install_fake_vllm
from verlx.rollout.engine_versions import UnsupportedEngineVersion
from verlx.rollout.residency import EngineStateError
from verlx.rollout.token_io import EngineGenerationError
from verlx.rollout.vllm_engine import VLLMRolloutEngine
from verlx.rollout.weight_sync import WeightSyncError


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    installed = []

    def install(version="0.33.0"):
        state = install_fake_vllm(version, str(tmp_path / "dist"))
        installed.append(state)
        return state

    yield install
    for state in reversed(installed):  # last in, first out: a second install saved the first as what to restore
        state.undo()


def build(tmp_path, **overrides):
    return VLLMRolloutEngine(make_ctx(str(tmp_path / "model"), **overrides))


def phases(calls) -> list[str]:
    """The call names, a generation's add_request / step calls in a row shown as one "generate"."""
    out = []
    for call in calls:
        name = "generate" if call[0] in ("add_request", "step") else call[0]
        if not (name == "generate" and out and out[-1] == "generate"):
            out.append(name)
    return out


def test_llm_arguments_and_environment(fake, tmp_path, monkeypatch):
    state = fake()
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    build(tmp_path, rank=3, world_size=4, tp_size=2)
    name, kwargs, env = state.calls[0]
    model = str(tmp_path / "model")
    assert kwargs == dict(
        model=model, tokenizer=model, skip_tokenizer_init=True, trust_remote_code=False, tensor_parallel_size=2,
        distributed_executor_backend="external_launcher", enable_sleep_mode=True, load_format="dummy",
        dtype="bfloat16", gpu_memory_utilization=0.5, enforce_eager=False, max_model_len=14, max_num_seqs=256,
        max_num_batched_tokens=8192, enable_chunked_prefill=True, enable_prefix_caching=True,
        disable_log_stats=True, disable_custom_all_reduce=True, seed=6, logprobs_mode="processed_logprobs",
    )  # seed = rollout.seed 5 + dp rank 1 (ranks 2, 3 form replica 1)
    assert env == {"LOCAL_RANK": "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "NCCL_NVLS_ENABLE": "0",
                   "PYTORCH_CUDA_ALLOC_CONF": None}
    assert os.environ["LOCAL_RANK"] == "3" and os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"


@pytest.mark.parametrize("version", ["0.11.0", "0.26.0", "0.33.0"])
def test_one_rl_step(fake, tmp_path, version):
    """0.11: the model at model_runner.model; 0.26.0 (run on the GPU machine): model_runner.get_model(), wake_up
    returns None; 0.33: wake_up says whether the engine is fully awake."""
    state = fake(version)
    engine = build(tmp_path)
    engine.update_weights(trainer_weights())
    engine.generate(left_padded_prompts())
    engine.sleep()
    engine.wake_up(["weights"])
    engine.update_weights(trainer_weights(scale=2.0))
    engine.wake_up(["kv_cache"])
    engine.generate(left_padded_prompts())
    assert phases(state.calls) == ["LLM", "reset_prefix_cache", "generate", "sleep", "wake_up", "wake_up", "generate"]
    assert [c for c in state.calls if c[0] in ("sleep", "wake_up")] == [
        ("sleep", 2), ("wake_up", ["weights"]), ("wake_up", ["kv_cache"])]  # rollout.sleep_level's default
    params = dict(state.llms[0].model.named_parameters())
    # trainer parameter i holds 2 * (i + 1): q, k, v are 3rd-5th (6, 8, 10), gate/up 8th-9th (16, 18)
    qkv = params["model.layers.0.self_attn.qkv_proj.weight"]
    assert qkv[:4].eq(6).all() and qkv[4:6].eq(8).all() and qkv[6:].eq(10).all()
    gate_up = params["model.layers.0.mlp.gate_up_proj.weight"]
    assert gate_up[:6].eq(16).all() and gate_up[6:].eq(18).all()
    assert params["lm_head.weight"].eq(24).all() and params["lm_head.weight"].dtype == torch.bfloat16


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_awake_times_each_part_of_the_cycle_and_pushes_a_version_once(fake, tmp_path, sleep_level):
    """The generation phase's cycle, timed apart (issue 26.3: wake, push and sleep within the gen phase): the push
    only for a version the engine does not hold yet (at sleep_level 2 the sleep discarded it), the sleep once the
    block has run."""
    import contextlib

    from verlx.rollout.base import PolicyWeights

    state = fake()
    engine = build(tmp_path, sleep_level=sleep_level)
    engine.update_weights(trainer_weights(), version=0)
    engine.sleep()
    weights = PolicyWeights(1, lambda: contextlib.nullcontext(trainer_weights(scale=2.0)))
    with engine.awake(weights) as timing:
        assert set(timing) == {"timing_s/wake_weights", "timing_s/update_weights", "timing_s/wake_kv_cache"}
    assert set(timing) == {"timing_s/wake_weights", "timing_s/update_weights", "timing_s/wake_kv_cache",
                           "timing_s/engine_sleep"}
    assert all(v >= 0 for v in timing.values()) and engine.residency.asleep
    with engine.awake(weights) as again:  # version 1 is held at level 1 (no push), discarded at level 2
        pass
    pushed_again = {"timing_s/update_weights"} if sleep_level == 2 else set()
    assert set(again) == {"timing_s/wake_weights", "timing_s/wake_kv_cache", "timing_s/engine_sleep", *pushed_again}
    assert [c[0] for c in state.calls if c[0] in ("sleep", "wake_up")] == ["sleep", "wake_up", "wake_up", "sleep",
                                                                          "wake_up", "wake_up", "sleep"]


@pytest.mark.parametrize("release_has_flat_logprobs", [True, False])
def test_generate_returns_the_shared_layout(fake, tmp_path, monkeypatch, release_has_flat_logprobs):
    """The same tokens and log-probs whether the release returns them flat (asked for where SamplingParams has
    flat_logprobs) or as a dict per position (older releases)."""
    from engine_fakes.fake_vllm import SamplingParams as FakeSamplingParams

    if not release_has_flat_logprobs:
        monkeypatch.setattr(FakeSamplingParams, "__struct_fields__",
                            tuple(f for f in FakeSamplingParams.__struct_fields__ if f != "flat_logprobs"))
    state = fake()
    engine = build(tmp_path, load_format="auto")
    out = engine.generate(left_padded_prompts({"n": 2}))
    adds = [c for c in state.calls if c[0] == "add_request"]
    assert [c[2] for c in adds] == [[5, 6, 7], [5, 6, 7], [9], [9]]  # one request per sample
    for _, _, _, sampling, kind in adds:
        assert sampling == dict(n=1, max_tokens=6, min_tokens=0, temperature=1.0, top_p=1.0, top_k=-1, seed=None,
                                stop=None, stop_token_ids=[EOS], ignore_eos=False, logprobs=0, detokenize=False,
                                skip_special_tokens=True, flat_logprobs=release_has_flat_logprobs)
        assert kind is RequestOutputKind.FINAL_ONLY
    # same fake sample rule as the SGLang test: 118 119 EOS | 105 EOS | 109 EOS | EOS
    assert out.batch["responses"].tolist() == [
        [118, 119, EOS, 0, 0, 0], [105, EOS, 0, 0, 0, 0], [109, EOS, 0, 0, 0, 0], [EOS, 0, 0, 0, 0, 0]
    ]
    expected = torch.tensor([[-0.1, -0.2, -0.3, 0, 0, 0], [-0.11, -0.21, 0, 0, 0, 0],
                             [-0.1, -0.2, 0, 0, 0, 0], [-0.11, 0, 0, 0, 0, 0]])
    assert torch.allclose(out.batch["rollout_log_probs"], expected)


def test_the_sleeping_pool_is_what_torch_counts_without_device_memory(fake, tmp_path):
    """vLLM's sleep unmaps its pool under tensors that stay allocated to torch (the actor's peak read 100 GB on an
    80 GB card): the engine reports the asleep mappings' bytes, which the training phases' peaks leave out."""
    state = fake()
    engine = build(tmp_path)
    weight_bytes = sum(p.numel() * p.element_size() for p in state.llms[0].model.parameters())
    assert engine.unbacked_allocated_bytes() == 0  # awake: every mapping holds device memory
    engine.sleep()
    assert engine.unbacked_allocated_bytes() == weight_bytes + KV_CACHE_BYTES
    engine.wake_up(["weights"])
    assert engine.unbacked_allocated_bytes() == KV_CACHE_BYTES
    engine.wake_up(["kv_cache"])
    assert engine.unbacked_allocated_bytes() == 0


def test_sleep_level_2_needs_every_parameter(fake, tmp_path):
    state = fake()
    engine = build(tmp_path, load_format="auto", sleep_level=2)
    engine.generate(left_padded_prompts())
    engine.sleep()
    engine.wake_up()
    with pytest.raises(EngineStateError, match="complete weight push"):
        engine.generate(left_padded_prompts())
    # without gate_proj, vLLM still reports gate_up_proj loaded (through up_proj); half of it is stale
    engine.update_weights([(n, t) for n, t in trainer_weights() if "gate_proj" not in n])
    with pytest.raises(EngineStateError, match="complete weight push"):
        engine.generate(left_padded_prompts())
    assert ("sleep", 2) in state.calls


def test_level_2_complete_push_restores_every_parameter(fake, tmp_path):
    state = fake()
    engine = build(tmp_path, load_format="auto", sleep_level=2)
    engine.sleep()
    engine.wake_up(["weights"])
    engine.update_weights([(n, t) for n, t in trainer_weights() if "o_proj" not in n])
    engine.wake_up(["kv_cache"])
    with pytest.raises(EngineStateError, match="complete weight push"):
        engine.generate(left_padded_prompts())
    engine.update_weights(trainer_weights())
    engine.generate(left_padded_prompts())
    assert not any(p.isnan().any() for p in state.llms[0].model.parameters())


def test_tied_embeddings_drop_lm_head(fake, tmp_path):
    state = fake()
    engine = build(tmp_path, tied=True)
    engine.update_weights(trainer_weights())  # the fake, like vLLM 0.33, raises if lm_head.weight arrives
    engine.generate(left_padded_prompts())
    assert "lm_head.weight" not in dict(state.llms[0].model.named_parameters())


def test_names_the_model_did_not_load_raise(fake, tmp_path):
    fake()
    engine = build(tmp_path)
    weights = trainer_weights() + [("model.layers.0.self_attn.rotary.weight", torch.ones(2))]
    with pytest.raises(WeightSyncError, match=r"update of \[model.layers.0.self_attn.rotary.weight\]: model.load_w"):
        engine.update_weights(weights)
    bad_shape = [(n, torch.ones(3, 3) if "o_proj" in n else t) for n, t in trainer_weights()]
    with pytest.raises(WeightSyncError, match="model.load_weights raised RuntimeError"):
        engine.update_weights(bad_shape)


def test_engine_refusals_surface(fake, tmp_path):
    state = fake()
    engine = build(tmp_path, load_format="auto", sleep_level=1)  # the loaded weights survive the sleep below
    state.reset_answer = False
    with pytest.raises(WeightSyncError, match="refused to reset the prefix cache"):
        engine.update_weights(trainer_weights())
    engine.sleep()
    state.stays_asleep = True
    with pytest.raises(EngineStateError, match="still asleep"):
        engine.wake_up()
    state.stays_asleep = False
    state.abort_samples[2] = "request aborted"
    with pytest.raises(EngineGenerationError, match="vllm did not finish sample 2"):
        engine.generate(left_padded_prompts({"n": 2}))


def test_bad_configuration(fake, tmp_path):
    fake()
    with pytest.raises(ValueError, match="engine_kwargs.vllm.logprobs_mode is set by verlx"):
        build(tmp_path, engine_kwargs=_kwargs(vllm={"logprobs_mode": "raw_logprobs"}))
    with pytest.raises(ValueError, match="Did you mean 'max_num_seqs'"):
        build(tmp_path, engine_kwargs=_kwargs(vllm={"max_num_seq": 3}))
    with pytest.raises(ValueError, match="sleep_level=0"):
        build(tmp_path, sleep_level=0)


def test_old_vllm_is_refused(fake, tmp_path):
    fake("0.10.2")
    with pytest.raises(UnsupportedEngineVersion, match=r"vllm 0\.10\.2 is not supported"):
        build(tmp_path)


def _kwargs(**engines):
    from verlx.config.roles import EngineKwargs

    return EngineKwargs(**engines)
