"""What server mode does the same for both engines (verlx/rollout/engine_server.py), against real HTTP server
processes speaking each engine's protocol (tests/engine_fakes/fake_vllm_server.py, fake_sglang_server.py): a server
that does not come up (exited, or not answering in time: stopped) is named with its port, its log's last lines and
what to check, and its log stays; a server whose process exits on its own is named, with its exit code and its log,
by the next call that finds it gone, and its log stays through the shutdown (which warns naming it). A clean stop
removing the log: the stream tests of test_vllm_server.py and test_sglang_server.py."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket

import pytest

from engine_fakes.contexts import left_padded_prompts
from engine_fakes.servers import served_fake, server_ctx, server_log
from verlx.rollout.engine_server import ServerExitedError, ServerStartError
from verlx.utils.distributed import free_port

START_ERRORS = {  # the engine's start-up failure (its stand-in's variable) and the line of it the log must show
    "vllm": ("FAKE_VLLM_START_ERROR", "CUDA out of memory. Tried to allocate 2.00 GiB",
             "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"),
    "sglang": ("FAKE_SGLANG_START_ERROR", "Rank 0 scheduler died during initialization (exit code: -9)",
               "Rank 0 scheduler died during initialization"),
}


def engine_class(engine: str):
    if engine == "vllm":
        from verlx.rollout.vllm_engine import VLLMRolloutEngine

        return VLLMRolloutEngine
    from verlx.rollout.sglang_engine import SGLangRolloutEngine

    return SGLangRolloutEngine


@pytest.mark.parametrize("failure", ["start_error", "port_taken"])
@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_server_that_does_not_come_up_names_its_port_log_and_what_to_check(tmp_path, monkeypatch, engine, failure):
    port = free_port()
    holder = socket.socket()
    variable, error, expected_in_log = START_ERRORS[engine]
    if failure == "start_error":
        monkeypatch.setenv(variable, error)
    else:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        expected_in_log = "address already in use"
    with served_fake(engine, tmp_path, monkeypatch):
        try:
            with pytest.raises(ServerStartError) as info:
                engine_class(engine)(server_ctx(tmp_path / "model", port))
        finally:
            holder.close()
    message = str(info.value)
    assert f"the {engine} server of rollout rank 0 did not come up on http://127.0.0.1:{port}: its process exited " \
           "with code 1" in message
    log = server_log(tmp_path, engine, port)
    assert f"its log {log}:" in message
    assert expected_in_log in (message.lower() if failure == "port_taken" else message)
    assert f"Check that port {port} is free" in message and "server.startup_timeout_s" in message
    with open(log) as f:  # the log the message names is still there
        assert expected_in_log in (f.read().lower() if failure == "port_taken" else f.read())


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_server_that_does_not_answer_in_time_is_stopped_and_its_log_kept(tmp_path, monkeypatch, engine):
    port = free_port()
    ctx = server_ctx(tmp_path / "model", port)
    ctx.config.server = dataclasses.replace(ctx.config.server, startup_timeout_s=0)  # running, not yet answering
    with served_fake(engine, tmp_path, monkeypatch):
        with pytest.raises(ServerStartError) as info:
            engine_class(engine)(ctx)
    health = "/health" if engine == "vllm" else "/health_generate"
    log = server_log(tmp_path, engine, port)
    assert f"did not come up on http://127.0.0.1:{port}: it did not answer http://127.0.0.1:{port}{health} within " \
           f"0s. The last lines of its log {log}:" in str(info.value)
    assert os.path.exists(log)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_server_that_exits_on_its_own_is_named_with_its_log_which_stays(tmp_path, monkeypatch, caplog, engine):
    port = free_port()
    generate = "inference/v1/generate" if engine == "vllm" else "generate"
    with served_fake(engine, tmp_path, monkeypatch):
        rollout = engine_class(engine)(server_ctx(tmp_path / "model", port))
        server = rollout._engine
        try:
            server.process.kill()
            with pytest.raises(ServerExitedError) as info:
                rollout.sleep()
            with pytest.raises(ServerExitedError, match=f"exited on its own with code -9 .*{generate}"):
                rollout.generate(left_padded_prompts())
            with caplog.at_level(logging.WARNING, logger="verlx.rollout.engine_server"):
                rollout.shutdown()
        finally:
            rollout.shutdown()
    log = server_log(tmp_path, engine, port)
    message = str(info.value)
    assert message.startswith(f"the {engine} server http://127.0.0.1:{port} exited on its own with code -9 (found "
                              "calling /")
    assert f"the last lines of its log {log} (kept):\n" in message
    assert "GET /health" in message  # the log's last lines: the health checks the server answered
    assert os.path.exists(log)
    assert [r.getMessage() for r in caplog.records if r.name == "verlx.rollout.engine_server"] == [
        f"the {engine} server http://127.0.0.1:{port} had exited on its own with code -9 before verlx stopped it; "
        f"its log is kept: {log}"]


def _broken_pipe_on(path: str, monkeypatch) -> None:
    """aiohttp raising "Broken pipe" while writing a request to `path`, as at step 3 of an SGLang server-mode run
    with images on an H100 (2026-11-27)."""
    import aiohttp

    post = aiohttp.ClientSession.post

    def failing_post(self, url, **kwargs):
        if str(url).endswith(path):
            raise aiohttp.ClientOSError(32, "Broken pipe")
        return post(self, url, **kwargs)

    monkeypatch.setattr(aiohttp.ClientSession, "post", failing_post)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("fault,error", [("closed", "ServerDisconnectedError: Server disconnected"),
                                         ("broken_pipe", "ClientOSError: [Errno 32] Broken pipe")])
def test_a_connection_failed_unanswered_is_named_with_its_log_which_stays(tmp_path, monkeypatch, engine, fault,
                                                                          error):
    """SGLang server-mode runs on an H100 (2026-11-27) ended at step 3 in aiohttp's bare "Server disconnected" (the
    server's log removed at the stop), and later in a bare "Broken pipe": now the server, the request, the error, its
    process and its log's last lines are named, and the log stays."""
    import verlx.rollout.engine_server as engine_server

    generate = "/inference/v1/generate" if engine == "vllm" else "/generate"
    monkeypatch.setattr(engine_server, "DISCONNECT_EXIT_WAIT_S", 0.2)
    if fault == "closed":
        monkeypatch.setenv("FAKE_SERVER_DROP", f"{generate}:1")
    port = free_port()
    with served_fake(engine, tmp_path, monkeypatch):
        rollout = engine_class(engine)(server_ctx(tmp_path / "model", port))
        try:
            pid = rollout._engine.process.pid
            if fault == "broken_pipe":
                _broken_pipe_on(generate, monkeypatch)
            with pytest.raises(engine_server.ServerDisconnectedError) as info:
                rollout.generate(left_padded_prompts())
        finally:
            rollout.shutdown()
    log = server_log(tmp_path, engine, port)
    message = str(info.value)
    assert message.startswith(f"the {engine} server http://127.0.0.1:{port} failed a {generate} request on its "
                              f"connection without answering ({error}), and its process {pid} still runs; the last "
                              f"lines of its log {log} (kept):\n")
    assert "GET /health" in message
    assert os.path.exists(log)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_step_after_the_server_closed_its_idle_connections_generates(tmp_path, monkeypatch, engine):
    """The client's event loop runs only while a step generates, so it cannot see the server close an idle
    kept-alive connection (uvicorn does after 5 s) between steps: a pooled connection would carry the next step's
    request into a closed socket. Each request gets a connection of its own."""
    import time

    monkeypatch.setenv("FAKE_SERVER_KEEPALIVE_S", "0.2")
    with served_fake(engine, tmp_path, monkeypatch):
        rollout = engine_class(engine)(server_ctx(tmp_path / "model", free_port()))
        try:
            first = rollout.generate(left_padded_prompts())
            time.sleep(1.0)  # the server closes the idle connections; the client's loop is not running
            second = rollout.generate(left_padded_prompts())
        finally:
            rollout.shutdown()
    assert second.batch["responses"].shape == first.batch["responses"].shape
