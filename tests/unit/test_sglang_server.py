"""Server mode (actor_rollout_ref.rollout.server.enable) against a real HTTP server process speaking SGLang's
protocol (the stand-in's Engine behind SGLang's endpoints, tests/engine_fakes/fake_sglang_server.py): verlx starts it,
waits for its health check, streams requests to it (the same batch an in-process engine gives), pushes weights as
in-process (handles through /update_weights_from_tensor inside a weight-update session), releases and resumes its
memory, aborts a partial rollout's requests, and stops it (its log removed); an engine without a server is refused
before Ray. Start failures and a server that exits on its own: test_engine_server.py."""

from __future__ import annotations

import base64
import io
import json
import os
import urllib.error
import urllib.request

import numpy as np
import pytest

from engine_fakes.contexts import left_padded_prompts, make_ctx, trainer_weights
from engine_fakes.servers import calls, served_fake, server_ctx, server_log
from verlx.config.roles import RolloutServerConfig
from verlx.rollout.sglang_engine import SGLangRolloutEngine
from verlx.utils.distributed import free_port


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """The stand-in in this process (the adapter's release checks, ServerArgs, the serializer) and importable by the
    server process."""
    with served_fake("sglang", tmp_path, monkeypatch) as state:
        yield state


def test_the_stream_and_the_weights_go_through_the_server(fake, tmp_path):
    port = free_port()
    engine = SGLangRolloutEngine(server_ctx(tmp_path / "model", port))
    try:
        assert engine.server_url == f"http://127.0.0.1:{port}"
        in_process = SGLangRolloutEngine(make_ctx(str(tmp_path / "reference"), load_format="auto"))
        want = in_process.generate(left_padded_prompts({"n": 2}))
        got = engine.generate(left_padded_prompts({"n": 2}))
        for key in want.batch:
            assert got.batch[key].tolist() == want.batch[key].tolist(), key
        engine.sleep()
        engine.wake_up(["weights"])
        engine.update_weights(trainer_weights(scale=2.0))
        engine.wake_up(["kv_cache"])
        engine.generate(left_padded_prompts())
        names = [c[0] for c in calls(engine.server_url)]
        hf_names = [n.replace("_fsdp_wrapped_module.", "") for n, _ in trainer_weights()]
        assert names == [
            "Engine", "async_generate", "async_generate",  # the two prompts, n=2 each
            "release_memory_occupation", "resume_memory_occupation",
            "begin_weight_update", "update_weights_from_tensor", "end_weight_update", "flush_cache",
            "resume_memory_occupation", "async_generate", "async_generate",
        ]
        update = [c for c in calls(engine.server_url) if c[0] == "update_weights_from_tensor"][0]
        assert update[1] == hf_names  # every tensor, by its HF name, in one bucket
        assert os.path.exists(server_log(tmp_path, "sglang", port))
    finally:
        engine.shutdown()
    with pytest.raises(urllib.error.URLError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
    assert not os.path.exists(server_log(tmp_path, "sglang", port))  # verlx stopped it cleanly: no log left


def test_images_go_to_the_server_as_base64_png_of_the_same_pixels(fake, tmp_path):
    from PIL import Image

    from helpers.vision_requests import ENGINE_PROMPTS, IMAGES, check_rollout, vision_batch, vl_ctx

    ctx = vl_ctx(tmp_path, load_format="auto")
    ctx.config.server = RolloutServerConfig(enable=True, port=free_port(), startup_timeout_s=60)
    engine = SGLangRolloutEngine(ctx)
    try:
        out = engine.generate(vision_batch({"n": 2}))
        requests = [c for c in calls(engine.server_url) if c[0] == "async_generate"]
        with urllib.request.urlopen(f"{engine.server_url}/fake_image_data", timeout=10) as response:
            image_data = json.loads(response.read())
    finally:
        engine.shutdown()
    assert [c[1] for c in requests] == ENGINE_PROMPTS
    assert sorted(image_data) == sorted(c[-1][0] for c in requests if c[1] != [9])  # c[-1]: the request ids
    for call, images in zip(requests, IMAGES):
        if not images:
            continue
        [sent] = image_data[call[-1][0]]  # n=2: one list for the prompt
        decoded = [Image.open(io.BytesIO(base64.b64decode(text))).convert("RGB") for text in sent]
        assert [np.asarray(d).tolist() for d in decoded] == [np.asarray(i).tolist() for i in images]
    check_rollout(out, 2)


def test_a_partial_rollout_aborts_the_requests_on_the_server(fake, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SGLANG_ROUNDS", "200")  # 2 s per request: still running when interrupted
    monkeypatch.setenv("FAKE_SGLANG_ROUND_S", "0.01")
    engine = SGLangRolloutEngine(server_ctx(tmp_path / "model", free_port()))
    try:
        prompts = left_padded_prompts({"generation_id": 0, "ignore_eos": True})
        asked = []
        out = engine.generate(prompts, lambda: asked.append(1) or len(asked) > 1)  # interrupted after one step
        assert out.batch["rollout_finished"].tolist() == [False, False]
        assert [c for c in calls(engine.server_url) if c[0] == "abort_request"] == [["abort_request", "", True]]
    finally:
        engine.shutdown()


def test_an_engine_without_a_server_is_refused_before_ray_naming_it():
    """native and hf have no server; sglang and vllm do."""
    from verlx.config.loader import build, load_yaml, to_container
    from verlx.config.schema import PPOConfig
    from verlx.rollout.capabilities import capability_problems

    def config(name, *more):
        return build(PPOConfig, to_container(load_yaml(overrides=[
            f"actor_rollout_ref.rollout.name={name}", "actor_rollout_ref.rollout.server.enable=true", *more])))

    (problem,) = capability_problems(config("native"))
    assert problem == ("actor_rollout_ref.rollout.server.enable=true needs a rollout engine that serves its requests "
                       "from an HTTP server, but actor_rollout_ref.rollout.name=native cannot "
                       "(NativeEngine.supports_server is False); use actor_rollout_ref.rollout.name=sglang or "
                       "actor_rollout_ref.rollout.name=vllm")
    assert capability_problems(config("sglang")) == capability_problems(config("vllm")) == []
    # vLLM's tensor-parallel peers run in lockstep in-process only: in server mode the group's first rank drives
    tools = ["actor_rollout_ref.rollout.multi_turn.enable=true", "trainer.n_gpus_per_node=2",
             "actor_rollout_ref.rollout.tensor_model_parallel_size=2"]
    assert capability_problems(config("vllm", *tools)) == []
    (problem,) = capability_problems(config("vllm", *tools, "actor_rollout_ref.rollout.server.enable=false"))
    assert problem.startswith("actor_rollout_ref.rollout.multi_turn.enable=true with actor_rollout_ref.rollout.name="
                              "vllm needs actor_rollout_ref.rollout.tensor_model_parallel_size=1")
    (problem,) = capability_problems(config("sglang", "trainer.nnodes=2", "trainer.n_gpus_per_node=2",
                                            "actor_rollout_ref.rollout.tensor_model_parallel_size=4"))
    assert problem.startswith("actor_rollout_ref.rollout.server.enable=true with actor_rollout_ref.rollout."
                              "tensor_model_parallel_size=4 > trainer.n_gpus_per_node=2: an engine server runs on one "
                              "node")
