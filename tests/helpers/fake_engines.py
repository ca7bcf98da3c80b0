"""The SGLang and vLLM adapters over the recording stand-ins of their packages (tests/engine_fakes), as engines a run
through Ray can name (rollout.name=helpers.fake_engines:FakeSGLangEngine): the stand-in is installed into each
worker process when its engine is built. Every request runs to its token budget with tokens inside the tiny test
model's vocabulary, one token per round (SGLang) or step (vLLM) taking engine_kwargs.custom.token_s seconds, so a
generation is still running when the trainer's weights change (partial rollout). Both also run in server mode,
against their stand-in's HTTP server (engine_kwargs.custom.request_log_dir: each server's request log copied to
rank<R>.log there, R the rank that started it)."""

from __future__ import annotations

import os
import tempfile

from engine_fakes.fake_http_server import REQUEST_LOG_ENV
from engine_fakes.fake_sglang import install_fake_sglang
from engine_fakes.fake_sglang_server import write_importable_package
from engine_fakes.fake_vllm import install_fake_vllm
from engine_fakes.fake_vllm_server import write_importable_package as write_importable_vllm
from verlx.rollout.sglang_engine import SGLangRolloutEngine
from verlx.rollout.vllm_engine import VLLMRolloutEngine

VOCAB = 100  # the tiny test model's (tests/helpers/tiny_tokenizer.py)
TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: where the stand-ins' files go (set by the test session to a folder of pytest's own temporary directory, which
#: pytest prunes): the engines are built in Ray workers that are killed, so they cannot remove what they wrote
SCRATCH_ENV = "VERLX_TEST_FAKE_ENGINE_DIR"


def scratch_dir(prefix: str) -> str:
    """A new folder under $VERLX_TEST_FAKE_ENGINE_DIR (the system's temporary directory when unset)."""
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get(SCRATCH_ENV))


def to_budget(prompt: list[int], sample: int, params: dict) -> tuple[list[int], list[float], str]:
    """max_new_tokens tokens in [10, 90), a function of the context and the sample."""
    n = params["max_new_tokens"]
    tokens = [(sum(prompt) + 7 * sample + k) % (VOCAB - 20) + 10 for k in range(n)]
    return tokens, [-1.0 - k / 100 for k in range(n)], "length"


def request_log_env(ctx) -> dict[str, str]:
    """Where the server this rank starts copies its request log, if the test asked (engine_kwargs.custom)."""
    folder = ctx.config.engine_kwargs.custom.get("request_log_dir")
    return {REQUEST_LOG_ENV: os.path.join(folder, f"rank{ctx.rank}.log")} if folder else {}


class _Available:
    """The stand-in is installed where the engine is built, not in the driver that checks the name."""

    @classmethod
    def is_available(cls) -> bool:
        return True

    @classmethod
    def check_install(cls) -> None:
        """The stand-in's release is checked when the engine is built."""


class FakeSGLangEngine(_Available, SGLangRolloutEngine):
    """In server mode (rollout.server.enable) the server process imports the stand-in too, set up alike."""

    def __init__(self, ctx):
        state = install_fake_sglang("0.5.17", scratch_dir("fake_sglang_"))
        state.completion = to_budget
        state.async_rounds = lambda ids: ctx.config.response_length
        state.round_s = float(ctx.config.engine_kwargs.custom.get("token_s", 0.0))
        if ctx.config.server.enable:
            site = write_importable_package(scratch_dir("fake_sglang_site_"))
            os.environ.update(
                PYTHONPATH=os.pathsep.join([site, TESTS, os.environ.get("PYTHONPATH", "")]),
                FAKE_SGLANG_VERSION="0.5.17", FAKE_SGLANG_DIST=scratch_dir("fake_sglang_server_"),
                FAKE_SGLANG_ROUNDS=str(ctx.config.response_length), FAKE_SGLANG_ROUND_S=str(state.round_s),
                FAKE_SGLANG_COMPLETION="helpers.fake_engines:to_budget", **request_log_env(ctx))
        super().__init__(ctx)


class FakeVLLMEngine(_Available, VLLMRolloutEngine):
    """In server mode (rollout.server.enable) the server process imports the stand-in too, set up alike."""

    def __init__(self, ctx):
        state = install_fake_vllm("0.26.0", scratch_dir("fake_vllm_"))
        state.completion = to_budget
        state.steps_of = lambda tokens: max(1, tokens)
        state.step_s = float(ctx.config.engine_kwargs.custom.get("token_s", 0.0))
        if ctx.config.server.enable:
            site = write_importable_vllm(scratch_dir("fake_vllm_site_"))
            os.environ.update(
                PYTHONPATH=os.pathsep.join([site, TESTS, os.environ.get("PYTHONPATH", "")]),
                FAKE_VLLM_VERSION="0.26.0", FAKE_VLLM_DIST=scratch_dir("fake_vllm_server_"),
                FAKE_VLLM_ONE_STEP_PER_TOKEN="1", FAKE_VLLM_STEP_S=str(state.step_s),
                FAKE_VLLM_COMPLETION="helpers.fake_engines:to_budget", **request_log_env(ctx))
        super().__init__(ctx)
