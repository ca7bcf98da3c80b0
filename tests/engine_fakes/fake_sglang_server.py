"""The HTTP server of the sglang stand-in: `launch_server(server_args)` serves a fake Engine over the endpoints of
SGLang's http_server (documented in /work/shared/reference/engine-apis.md and read from SGLang's server clients):
/health, /health_generate, /generate, /abort_request, /release_memory_occupation, /resume_memory_occupation,
/update_weights_from_tensor (serialized_named_tensors: one MultiprocessingSerializer string per TP rank), /flush_cache
and, from 0.5.21, /begin_weight_update and /end_weight_update. /fake_calls and /fake_image_data (test-only) return
what the engine was asked and the image_data of its requests, so a test in another process can check them.

`write_importable_package(site_dir)` writes an `sglang` package that installs the stand-in when a subprocess imports
it (with site_dir and tests/ on its PYTHONPATH, FAKE_SGLANG_VERSION and FAKE_SGLANG_DIST in its environment;
FAKE_SGLANG_START_ERROR makes the engine fail to start, FAKE_SGLANG_ROUNDS / FAKE_SGLANG_ROUND_S make every request
take that many rounds of that many seconds, FAKE_SGLANG_COMPLETION names a `module:function` making the tokens).
"""

from __future__ import annotations

import asyncio
import dataclasses

from engine_fakes.fake_http_server import FakeHTTPServer
from engine_fakes.fake_http_server import write_importable_package as write_package

SHIM = '''"""The recording stand-in of sglang for a subprocess (tests/engine_fakes/fake_sglang_server.py)."""
import importlib
import os

from engine_fakes.fake_sglang import install_fake_sglang

state = install_fake_sglang(os.environ["FAKE_SGLANG_VERSION"], os.environ["FAKE_SGLANG_DIST"])
state.start_error = os.environ.get("FAKE_SGLANG_START_ERROR") or None
if os.environ.get("FAKE_SGLANG_ROUNDS"):
    state.async_rounds = lambda ids: int(os.environ["FAKE_SGLANG_ROUNDS"])
    state.round_s = float(os.environ.get("FAKE_SGLANG_ROUND_S", "0"))
if os.environ.get("FAKE_SGLANG_COMPLETION"):
    module, name = os.environ["FAKE_SGLANG_COMPLETION"].split(":")
    state.completion = getattr(importlib.import_module(module), name)
'''


def write_importable_package(site_dir: str) -> str:
    return write_package(site_dir, "sglang", SHIM)


def _fields(server_args) -> dict:
    if dataclasses.is_dataclass(server_args):
        return dataclasses.asdict(server_args)
    return {name: getattr(server_args, name) for name in server_args.__struct_fields__}


class FakeSGLangServer(FakeHTTPServer):
    health_paths = ("/health", "/health_generate")

    def __init__(self, state, engine, serializer):
        self.state, self.engine, self.serializer = state, engine, serializer

    def routes(self) -> list[tuple[str, str, object]]:
        routes = [("POST", "/generate", self.generate), ("POST", "/abort_request", self.abort_request),
                  ("POST", "/release_memory_occupation", self.memory),
                  ("POST", "/resume_memory_occupation", self.memory),
                  ("POST", "/update_weights_from_tensor", self.update_weights), ("*", "/flush_cache", self.flush_cache),
                  ("GET", "/fake_calls", self.fake_calls), ("GET", "/fake_image_data", self.fake_image_data)]
        if hasattr(self.engine, "begin_weight_update"):
            routes += [("POST", "/begin_weight_update", self.session), ("POST", "/end_weight_update", self.session)]
        return routes

    def status_of(self, result):
        success, message = result if isinstance(result, tuple) else (result.success, "")
        return self.answer({"success": success, "message": message}, 200 if success else 400)

    async def generate(self, request):
        body = await request.json()
        try:
            out = await self.engine.async_generate(input_ids=body["input_ids"], sampling_params=body["sampling_params"],
                                                   return_logprob=body.get("return_logprob", False),
                                                   rid=body.get("rid"), image_data=body.get("image_data"))
        except RuntimeError as e:
            return self.answer({"error": {"message": str(e)}}, 400)
        return self.answer(out)

    async def abort_request(self, request):
        body = await request.json()
        self.engine.tokenizer_manager.abort_request(rid=body.get("rid", ""), abort_all=body.get("abort_all", False))
        return self.answer()

    async def memory(self, request):
        body = await request.json()
        try:
            getattr(self.engine, request.path.strip("/"))(tags=body.get("tags"))
        except RuntimeError as e:
            return self.answer({"error": {"message": str(e)}}, 400)
        return self.answer()

    async def update_weights(self, request):
        body = await request.json()
        named = self.serializer.deserialize(body["serialized_named_tensors"][0])
        return self.status_of(self.engine.update_weights_from_tensor(named, load_format=body.get("load_format"),
                                                                     flush_cache=body.get("flush_cache", True)))

    async def flush_cache(self, request):
        return self.status_of(self.engine.flush_cache())

    async def session(self, request):
        return self.status_of(getattr(self.engine, request.path.strip("/"))())

    async def fake_calls(self, request):
        return self.answer([[c[0], *(x for x in c[1:] if isinstance(x, (str, bool, int, list)) and c[0] != "Engine")]
                            for c in self.state.calls])

    async def fake_image_data(self, request):
        return self.answer(self.state.image_data)


def make_launch_server(state, engine_cls, serializer):
    def launch_server(server_args, pipe_finish_writer=None, launch_callback=None):
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        engine = engine_cls(**{k: v for k, v in _fields(server_args).items() if k != "host"})
        engine.loop = loop  # the server's loop is the tokenizer manager's
        server = FakeSGLangServer(state, engine, serializer)
        loop.run_until_complete(server.serve(server_args.host, server_args.port))

    return launch_server
