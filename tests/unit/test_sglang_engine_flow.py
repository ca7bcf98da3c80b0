"""SGLangRolloutEngine driven against a recording stand-in of sglang's documented Engine API: construction
arguments and environment, the release/resume/push/flush order, update sessions, statuses and refusals."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest
import torch

from engine_fakes.contexts import EOS, left_padded_prompts, make_ctx, trainer_weights
from engine_fakes.fake_sglang import install_fake_sglang
from verlx.protocol import DataProto
from verlx.rollout import sglang_engine
from verlx.rollout.engine_versions import UnsupportedEngineVersion
from verlx.rollout.residency import EngineStateError
from verlx.rollout.sglang_engine import SGLangRolloutEngine
from verlx.rollout.token_io import EngineGenerationError
from verlx.rollout.weight_sync import WeightSyncError

ALL_TAGS = ["kv_cache", "weights", "cuda_graph"]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_DEVICE_MAX_CONNECTIONS", raising=False)
    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    monkeypatch.delenv("NCCL_NVLS_ENABLE", raising=False)
    start_method = mp.get_start_method(allow_none=True)
    installed = []

    def install(version="0.5.23", **kwargs):
        state = install_fake_sglang(version, str(tmp_path / "dist"), **kwargs)
        installed.append(state)
        return state

    yield install
    for state in reversed(installed):  # last in, first out: a second install saved the first as what to restore
        state.undo()
    mp.set_start_method(start_method, force=True)


def build(tmp_path, **overrides):
    return SGLangRolloutEngine(make_ctx(str(tmp_path / "model"), **overrides))


def phases(calls) -> list[str]:
    """The call names, a generation's async_generate calls in a row shown as one "generate"."""
    out = []
    for call in calls:
        name = "generate" if call[0] == "async_generate" else call[0]
        if not (name == "generate" and out and out[-1] == "generate"):
            out.append(name)
    return out


@pytest.fixture
def megatron_importable(monkeypatch):
    """Whether megatron-core is importable where the engine starts, set by the test (not by this venv)."""
    def set_to(value: bool) -> None:
        monkeypatch.setattr(sglang_engine, "megatron_core_importable", lambda: value)
    set_to(False)
    return set_to


def test_engine_arguments_environment_and_restored_caller_env(fake, tmp_path, monkeypatch, megatron_importable):
    state = fake("0.5.23")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True,max_split_size_mb:64")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    build(tmp_path)
    name, kwargs, env = state.calls[0]
    assert name == "Engine"
    model = str(tmp_path / "model")
    assert kwargs == dict(
        model_path=model, tokenizer_path=model, skip_tokenizer_init=True, trust_remote_code=False, dtype="bfloat16",
        load_format="dummy", mem_fraction_static=0.5, enable_memory_saver=True, enable_weights_cpu_backup=False,
        tp_size=1, dp_size=1, base_gpu_id=0, gpu_id_step=1, nnodes=1, node_rank=0, dist_init_addr=None,
        port=30000, nccl_port=30001, random_seed=5, context_length=16, max_running_requests=256,
        chunked_prefill_size=8192, disable_cuda_graph=False, disable_prefill_cuda_graph=True,
        disable_radix_cache=False, log_level="error",
    )
    assert env == {
        "CUDA_VISIBLE_DEVICES": "3",
        "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "false",
        "SGLANG_BLOCK_NONZERO_RANK_CHILDREN": "0",
        "NCCL_NVLS_ENABLE": "0",
        "NCCL_GRAPH_REGISTER": "0",
        "SGLANG_MEMORY_SAVER_CUDA_GRAPH": "1",
        "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64",
        "SGLANG_MM_AVOID_RETOKENIZE": "true",
    }
    # what sglang.Engine() wrote into the caller is put back, and so is the multiprocessing start method
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True,max_split_size_mb:64"
    for key in ("CUDA_DEVICE_MAX_CONNECTIONS", "NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE",
                "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK"):
        assert key not in os.environ


def test_graph_pool_released_only_where_the_prefill_graphs_allow_it(fake, tmp_path, megatron_importable):
    """Default: no prefill graphs, so the release may pause the graph pool. A user who turns prefill graphs back on
    keeps the pool resident instead of a start that fails (breakable graphs refuse memory-saver mode)."""
    state = fake("0.5.17")
    build(tmp_path)
    assert state.calls[0][2]["SGLANG_MEMORY_SAVER_CUDA_GRAPH"] == "1"
    state = fake("0.5.17")
    build(tmp_path, engine_kwargs=_kwargs(sglang={"disable_prefill_cuda_graph": False}))
    assert state.calls[0][1]["disable_prefill_cuda_graph"] is False
    assert state.calls[0][2]["SGLANG_MEMORY_SAVER_CUDA_GRAPH"] is None


def test_graph_pool_stays_resident_where_megatron_core_is_importable(fake, tmp_path, megatron_importable, caplog):
    """SGLang's scheduler imports megatron-core when it can, which puts torch_memory_saver in a mode that cannot
    pause CUDA graphs (the start failed on 4 × H100): the graphs stay resident instead, and the log says so."""
    megatron_importable(True)
    state = fake("0.5.17")
    with caplog.at_level("WARNING"):
        build(tmp_path)
    assert state.calls[0][2]["SGLANG_MEMORY_SAVER_CUDA_GRAPH"] is None
    assert any("megatron-core is importable" in r.getMessage() for r in caplog.records)


def test_one_rl_step_calls_the_engine_in_order(fake, tmp_path):
    state = fake("0.5.23")
    engine = build(tmp_path)
    engine.update_weights(trainer_weights())
    engine.generate(left_padded_prompts())
    engine.sleep()
    engine.wake_up(["weights"])
    engine.update_weights(trainer_weights(scale=2.0))
    engine.wake_up(["kv_cache"])
    engine.generate(left_padded_prompts())
    assert phases(state.calls) == [
        "Engine",
        "begin_weight_update", "update_weights_from_tensor", "end_weight_update", "flush_cache",
        "generate",
        "release_memory_occupation",
        "resume_memory_occupation",
        "begin_weight_update", "update_weights_from_tensor", "end_weight_update", "flush_cache",
        "resume_memory_occupation",
        "generate",
    ]
    assert [c for c in state.calls if c[0].endswith("_memory_occupation")] == [
        ("release_memory_occupation", ALL_TAGS), ("resume_memory_occupation", ["weights"]),
        ("resume_memory_occupation", ["kv_cache", "cuda_graph"])]
    hf_names = [n.replace("_fsdp_wrapped_module.", "") for n, _ in trainer_weights()]
    assert state.calls[2] == ("update_weights_from_tensor", hf_names, None, False)
    received = dict(state.engines[0].received[1])
    assert list(received) == hf_names
    # second push: parameter i is filled with 2 * (i + 1), cast to the engine dtype
    for i, name in enumerate(hf_names):
        assert received[name].dtype == torch.bfloat16
        assert torch.equal(received[name], torch.full_like(received[name], 2.0 * (i + 1)))
    assert state.patch_calls == 2


def test_generate_returns_the_shared_layout(fake, tmp_path):
    state = fake("0.5.23")
    engine = build(tmp_path, load_format="auto")
    out = engine.generate(left_padded_prompts({"n": 2}))
    requests = [c for c in state.calls if c[0] == "async_generate"]
    assert [c[1] for c in requests] == [[5, 6, 7], [9]]  # a prompt's samples: one request with n
    for _, _, sampling, return_logprob, rid in requests:
        assert return_logprob is True and len(rid) == 2
        assert sampling == dict(n=2, max_new_tokens=6, min_new_tokens=0, temperature=1.0, top_p=1.0, top_k=-1,
                                ignore_eos=False, stop_token_ids=[EOS], no_stop_trim=True, skip_special_tokens=False)
    # fake outputs: prompt sum s, sample j -> base s + 7j, 1 + base % 4 tokens (base + k) % 20 + 100 ending in EOS
    # [5,6,7]: base 18 -> 118 119 EOS; base 25 -> 105 EOS.  [9]: base 9 -> 109 EOS; base 16 -> EOS
    assert out.batch["responses"].tolist() == [
        [118, 119, EOS, 0, 0, 0], [105, EOS, 0, 0, 0, 0], [109, EOS, 0, 0, 0, 0], [EOS, 0, 0, 0, 0, 0]
    ]
    assert out.batch["response_mask"].tolist() == [
        [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0]
    ]
    # log-prob of token k of sample j: -(k + 1) / 10 - j / 100
    expected = torch.tensor([[-0.1, -0.2, -0.3, 0, 0, 0], [-0.11, -0.21, 0, 0, 0, 0],
                             [-0.1, -0.2, 0, 0, 0, 0], [-0.11, 0, 0, 0, 0, 0]])
    assert torch.allclose(out.batch["rollout_log_probs"], expected)
    assert list(out.non_tensor_batch["uid"]) == ["a", "a", "b", "b"]
    assert out.batch["input_ids"].shape == (4, 10)


def test_forced_responses_of_a_full_length_prompt_keep_every_token(fake, tmp_path):
    """SGLang clips max_new_tokens to context_length - prompt - 2; the engine's context leaves room for that, so a
    prompt of prompt_length with ignore_eos gets all response_length tokens (on the GPU they came back 2 short)."""
    fake("0.5.17")
    engine = build(tmp_path, load_format="auto")
    ids = torch.arange(8).unsqueeze(0) + 20
    prompts = DataProto({"input_ids": ids, "attention_mask": torch.ones_like(ids),
                         "position_ids": torch.arange(8).unsqueeze(0)}, {"uid": ["a"]}, {"ignore_eos": True})
    out = engine.generate(prompts)
    assert out.batch["response_mask"].sum().item() == 6


def test_random_or_discarded_weights_need_a_complete_push(fake, tmp_path):
    fake("0.5.23")
    engine = build(tmp_path, sleep_level=2)
    with pytest.raises(EngineStateError, match="complete weight push"):
        engine.generate(left_padded_prompts())
    partial = [(n, t) for n, t in trainer_weights() if "down_proj" not in n]
    engine.update_weights(partial)
    with pytest.raises(EngineStateError, match="complete weight push"):
        engine.generate(left_padded_prompts())
    engine.update_weights(trainer_weights())
    engine.generate(left_padded_prompts())
    engine.sleep()
    engine.wake_up()
    with pytest.raises(EngineStateError, match="sleep_level=2"):
        engine.generate(left_padded_prompts())


def test_sleep_level_1_keeps_weights_across_release(fake, tmp_path):
    state = fake("0.5.23")
    engine = build(tmp_path, load_format="auto", sleep_level=1)
    engine.sleep()
    with pytest.raises(EngineStateError, match="released"):
        engine.generate(left_padded_prompts())
    engine.wake_up()
    engine.generate(left_padded_prompts())
    assert state.calls[0][1]["enable_weights_cpu_backup"] is True


def test_rejected_bucket_raises_with_names_and_engine_message(fake, tmp_path):
    state = fake("0.5.23")
    state.fail_names["model.layers.0.mlp.up_proj.weight"] = "size mismatch for up_proj: [6, 4] vs [12, 4]"
    engine = build(tmp_path)
    with pytest.raises(WeightSyncError) as info:
        engine.update_weights(trainer_weights())
    err = info.value
    assert err.engine == "sglang" and "model.layers.0.mlp.up_proj.weight" in err.names
    assert "size mismatch for up_proj: [6, 4] vs [12, 4]" in str(err)
    assert state.names()[-2:] == ["update_weights_from_tensor", "end_weight_update"]  # session closed, no flush


def test_update_outside_a_session_is_detected(fake, tmp_path):
    # An engine that needs a session while the installed version says it does not: the silent (False, msg) raises.
    state = fake("0.5.20", requires_session=True)
    engine = build(tmp_path)
    with pytest.raises(WeightSyncError, match="requires an open weight-update session"):
        engine.update_weights(trainer_weights())
    assert "begin_weight_update" not in state.names()


def test_update_while_weights_released_is_refused(fake, tmp_path):
    fake("0.5.23")
    engine = build(tmp_path)
    engine.sleep()
    with pytest.raises(EngineStateError, match=r"wake_up\(\['weights'\]\)"):
        engine.update_weights(trainer_weights())


@pytest.mark.parametrize("version", ["0.5.8", "0.6.0", "0.4.10"])
def test_versions_outside_the_range_are_refused(fake, tmp_path, version):
    fake(version)
    with pytest.raises(UnsupportedEngineVersion, match=r"supported: sglang>=0\.5\.9,<0\.6"):
        build(tmp_path)


def test_engine_kwargs_are_checked_against_server_args(fake, tmp_path):
    fake("0.5.23")
    with pytest.raises(ValueError, match="Did you mean 'cuda_graph_max_bs_decode'"):
        build(tmp_path, engine_kwargs=_kwargs(sglang={"cuda_graph_max_bs": 8}))
    with pytest.raises(ValueError, match="engine_kwargs.sglang.tp_size is set by verlx"):
        build(tmp_path, engine_kwargs=_kwargs(sglang={"tp_size": 2}))


def test_dataclass_server_args_before_0_5_20(fake, tmp_path):
    state = fake("0.5.19")
    build(tmp_path, engine_kwargs=_kwargs(sglang={"cuda_graph_max_bs": 8, "log_level": "info"}))
    kwargs = state.calls[0][1]
    assert kwargs["cuda_graph_max_bs"] == 8 and kwargs["log_level"] == "info"


def test_free_cache_engine_false_never_releases(fake, tmp_path):
    state = fake("0.5.23")
    engine = build(tmp_path, load_format="auto", free_cache_engine=False)
    engine.sleep()
    engine.wake_up()
    engine.generate(left_padded_prompts())
    assert phases(state.calls) == ["Engine", "generate"]


def test_bad_calls_fail_with_a_message(fake, tmp_path):
    state = fake("0.5.23")
    engine = build(tmp_path, load_format="auto")
    with pytest.raises(ValueError, match="unknown wake-up tags"):
        engine.wake_up(["cuda_graphs"])
    with pytest.raises(ValueError, match="exceeds rollout.response_length=6"):
        engine.generate(left_padded_prompts({"max_new_tokens": 7}))
    state.abort_samples[1] = "prompt is too long"
    with pytest.raises(EngineGenerationError, match="sample 1 .*abort.*prompt is too long"):
        engine.generate(left_padded_prompts())
    with pytest.raises(ValueError, match="sleep_level=3"):
        build(tmp_path, sleep_level=3)


def _kwargs(**engines):
    from verlx.config.roles import EngineKwargs

    return EngineKwargs(**engines)


def test_buckets_follow_update_weights_bucket_megabytes(fake, tmp_path):
    state = fake("0.5.23")
    engine = build(tmp_path, load_format="auto", update_weights_bucket_megabytes=1)
    # in bf16: a, b = 600,000 bytes each, c = 20 bytes; 1 MiB = 1,048,576 bytes -> buckets [a], [b, c]
    engine.update_weights([("a", torch.zeros(300_000)), ("b", torch.zeros(300_000)), ("c", torch.zeros(10))])
    updates = [c for c in state.calls if c[0] == "update_weights_from_tensor"]
    assert updates == [("update_weights_from_tensor", ["a"], None, False),
                       ("update_weights_from_tensor", ["b", "c"], None, False)]
    assert state.names()[1:] == ["begin_weight_update", "update_weights_from_tensor", "update_weights_from_tensor",
                                 "end_weight_update", "flush_cache"]
