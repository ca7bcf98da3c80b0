"""Server mode of the vllm engine (actor_rollout_ref.rollout.server.enable) against a real HTTP server process that
behaves as vLLM 0.26.0's OpenAI-compatible server (the stand-in's engine behind its endpoints,
tests/engine_fakes/fake_vllm_server.py): verlx starts it with the in-process arguments and its development
endpoints, waits for /health, generates through /inference/v1/generate (the same batch as in-process), pushes
weights through /collective_rpc into its weight receiver in every worker (the loaded names checked as in-process),
sleeps and wakes it, aborts a partial rollout's requests by name (they come back with the tokens they had), and
stops it (its log removed). Start failures and a server that exits on its own: test_engine_server.py."""

from __future__ import annotations

import os
import urllib.error
import urllib.request

import pytest
import torch

from engine_fakes.contexts import left_padded_prompts, make_ctx, trainer_weights
from engine_fakes.fake_sglang import fake_completion
from engine_fakes.servers import calls, served_fake, server_ctx, server_log
from verlx.protocol import DataProto
from verlx.rollout.vllm_engine import VLLMRolloutEngine
from verlx.rollout.vllm_server import SERVER_ENV
from verlx.rollout.weight_sync import WeightSyncError
from verlx.utils.distributed import free_port

HF_NAMES = [n.replace("_fsdp_wrapped_module.", "") for n, _ in trainer_weights()]


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The stand-in in this process (the release check, EngineArgs) and importable by the server process."""
    with served_fake("vllm", tmp_path, monkeypatch) as state:
        yield state


def test_the_stream_and_the_weights_go_through_the_server(fake, tmp_path):
    port = free_port()
    engine = VLLMRolloutEngine(server_ctx(tmp_path / "model", port))
    try:
        assert engine.server_url == f"http://127.0.0.1:{port}"
        (_, server_env), (_, llm_args, _) = calls(engine.server_url)[:2]
        assert llm_args["worker_extension_cls"] == "verlx.rollout.vllm_weight_receiver.VLLMWeightReceiver"
        assert llm_args["distributed_executor_backend"] == "uni" and llm_args["seed"] == 5
        assert llm_args["logprobs_mode"] == "processed_logprobs" and llm_args["enable_sleep_mode"] is True
        assert server_env["VLLM_SERVER_DEV_MODE"] == "1" and server_env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
        assert server_env["NCCL_NVLS_ENABLE"] == "0" and server_env["PYTORCH_CUDA_ALLOC_CONF"] is None
        got = engine.generate(left_padded_prompts({"n": 2}))
        in_process = VLLMRolloutEngine(make_ctx(str(tmp_path / "reference"), load_format="auto"))
        want = in_process.generate(left_padded_prompts({"n": 2}))
        for key in want.batch:
            assert got.batch[key].tolist() == want.batch[key].tolist(), key
        engine.sleep()
        engine.wake_up(["weights"])
        engine.update_weights(trainer_weights(scale=2.0))
        engine.wake_up(["kv_cache"])
        engine.generate(left_padded_prompts())
        seen = calls(engine.server_url)
        names = [c[0] for c in seen if c[0] in ("add_request", "sleep", "wake_up", "collective_rpc",
                                                 "reset_prefix_cache")]
        assert names == [
            "collective_rpc",  # the model's parameter names and packed modules, at start
            "add_request", "add_request", "add_request", "add_request",  # two prompts, n=2 each
            "sleep", "wake_up", "collective_rpc", "wake_up",  # every tensor in one bucket; no reset while asleep
            "add_request", "add_request",
        ]
        (info,), (loaded,) = [c[2] for c in seen if c[0] == "collective_rpc"]
        assert info["packed_modules_mapping"] == {"qkv_proj": ["q_proj", "k_proj", "v_proj"],
                                                  "gate_up_proj": ["gate_proj", "up_proj"]}
        fused = {"model.layers.0.self_attn.qkv_proj.weight", "model.layers.0.mlp.gate_up_proj.weight"}
        assert set(loaded) == set(info["param_names"]) == {n for n in HF_NAMES if "q_proj" not in n and "k_proj"
                                                           not in n and "v_proj" not in n and "gate_proj" not in n
                                                           and "up_proj" not in n} | fused
        assert [c[1] for c in seen if c[0] in ("sleep", "wake_up")] == [2, ["weights"], ["kv_cache"]]
        assert os.path.exists(server_log(tmp_path, "vllm", port))
    finally:
        engine.shutdown()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    assert not os.path.exists(server_log(tmp_path, "vllm", port))  # verlx stopped it cleanly: no log left


def test_a_partial_rollout_aborts_its_requests_by_name_and_keeps_their_tokens(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_VLLM_ONE_STEP_PER_TOKEN", "1")
    monkeypatch.setenv("FAKE_VLLM_STALL_AFTER", "2")  # every request holds 2 of its 6 tokens until aborted
    engine = VLLMRolloutEngine(server_ctx(tmp_path / "model", free_port()))
    try:
        prompts = left_padded_prompts({"generation_id": 0, "ignore_eos": True})

        def stalled() -> bool:  # three engine steps with both requests running: each holds its 2 tokens
            return sum(1 for c in calls(engine.server_url) if c[0] == "step" and len(c[1]) == 2) >= 3

        out = engine.generate(prompts, stalled)
        assert out.batch["rollout_finished"].tolist() == [False, False]
        expected = [fake_completion(ids, 0, {"max_new_tokens": 6, "stop_token_ids": []}) for ids in ([5, 6, 7], [9])]
        assert out.batch["responses"][:, :2].tolist() == [tokens[:2] for tokens, _, _ in expected]
        assert out.batch["response_mask"].sum(-1).tolist() == [2, 2]
        assert out.batch["rollout_log_probs"][:, :2].flatten().tolist() == pytest.approx(
            [lp for _, lps, _ in expected for lp in lps[:2]])
        seen = calls(engine.server_url)
        # by name (the server may be answering other clients), each name the prompt's request with its samples
        assert [c[1] for c in seen if c[0] == "abort_requests"] == [["generate-tokens-verlx-0-0",
                                                                     "generate-tokens-verlx-0-1"]]
        assert sorted(sum([c[1] for c in seen if c[0] == "abort_request"], [])) == [
            "0_generate-tokens-verlx-0-0", "0_generate-tokens-verlx-0-1"]
    finally:
        engine.shutdown()


def test_a_server_log_directory_keeps_the_log_after_a_clean_stop(fake, tmp_path):
    port = free_port()
    ctx = server_ctx(tmp_path / "model", port)
    ctx.config.server.log_dir = str(tmp_path / "server_logs")
    engine = VLLMRolloutEngine(ctx)
    try:
        engine.generate(left_padded_prompts())
    finally:
        engine.shutdown()
    assert os.listdir(tmp_path / "server_logs") == [f"verlx_vllm_server_rank0_port{port}.log"]
    assert not os.path.exists(server_log(tmp_path, "vllm", port))  # nothing in the temporary directory


def test_every_prompt_of_a_large_batch_is_in_flight_at_once(fake, tmp_path, monkeypatch):
    """More prompts than an HTTP client's usual connection pool (aiohttp's holds all but 100 back): all reach the
    server before its first engine step, so the engine schedules the whole batch."""
    prompts = 150
    monkeypatch.setenv("FAKE_VLLM_HOLD_UNTIL", str(prompts))
    engine = VLLMRolloutEngine(server_ctx(tmp_path / "model", free_port()))
    try:
        input_ids = torch.tensor([[5, 6, 7 + i % 50] for i in range(prompts)])
        batch = DataProto({"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids),
                           "position_ids": torch.arange(3).expand(prompts, 3)},
                          {"uid": [str(i) for i in range(prompts)]})
        out = engine.generate(batch)
        assert out.batch["responses"].shape[0] == prompts
        assert [c[1] for c in calls(engine.server_url) if c[0] == "in_flight_at_first_step"] == [prompts]
    finally:
        engine.shutdown()


def test_a_push_the_model_does_not_load_raises_on_every_name(fake, tmp_path):
    engine = VLLMRolloutEngine(server_ctx(tmp_path / "model", free_port()))
    try:
        renamed = [(name.replace("o_proj", "out_proj"), tensor) for name, tensor in trainer_weights()]
        with pytest.raises(WeightSyncError, match=r"model.layers.0.self_attn.out_proj.weight.*did not load them"):
            engine.update_weights(renamed)
    finally:
        engine.shutdown()


def test_a_server_without_its_development_endpoints_is_named(fake, tmp_path, monkeypatch):
    """Without VLLM_SERVER_DEV_MODE=1 vLLM serves no /collective_rpc (nor /sleep, /abort_requests...): the start
    stops at the first call to one, saying which and why."""
    monkeypatch.setitem(SERVER_ENV, "VLLM_SERVER_DEV_MODE", "0")
    port = free_port()
    with pytest.raises(RuntimeError, match=r"vllm server http://127.0.0.1:\d+/collective_rpc answered 404: .*; this "
                                           r"vLLM release's server has no /collective_rpc: .*VLLM_SERVER_DEV_MODE=1"):
        VLLMRolloutEngine(server_ctx(tmp_path / "model", port))
    with pytest.raises(urllib.error.URLError):  # and the server was stopped
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    assert os.path.exists(server_log(tmp_path, "vllm", port))  # a start that raised keeps its log
