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
import os

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
    os.makedirs(os.path.join(site_dir, "sglang"), exist_ok=True)
    with open(os.path.join(site_dir, "sglang", "__init__.py"), "w") as f:
        f.write(SHIM)
    return site_dir


def _fields(server_args) -> dict:
    if dataclasses.is_dataclass(server_args):
        return dataclasses.asdict(server_args)
    return {name: getattr(server_args, name) for name in server_args.__struct_fields__}


def make_launch_server(state, engine_cls, serializer):
    def launch_server(server_args, pipe_finish_writer=None, launch_callback=None):
        from aiohttp import web

        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        kwargs = {k: v for k, v in _fields(server_args).items() if k != "host"}
        engine = engine_cls(**kwargs)
        engine.loop = loop  # the server's loop is the tokenizer manager's

        def ok(answer=None, status: int = 200):
            return web.json_response(answer if answer is not None else {}, status=status)

        def status_of(result):
            success, message = result if isinstance(result, tuple) else (result.success, "")
            return ok({"success": success, "message": message}, 200 if success else 400)

        async def health(request):
            return web.Response(text="OK")

        async def generate(request):
            body = await request.json()
            try:
                out = await engine.async_generate(input_ids=body["input_ids"], sampling_params=body["sampling_params"],
                                                  return_logprob=body.get("return_logprob", False),
                                                  rid=body.get("rid"), image_data=body.get("image_data"))
            except RuntimeError as e:
                return ok({"error": {"message": str(e)}}, 400)
            return ok(out)

        async def abort_request(request):
            body = await request.json()
            engine.tokenizer_manager.abort_request(rid=body.get("rid", ""), abort_all=body.get("abort_all", False))
            return ok()

        async def memory(request):
            body = await request.json()
            method = request.path.strip("/")
            try:
                getattr(engine, method)(tags=body.get("tags"))
            except RuntimeError as e:
                return ok({"error": {"message": str(e)}}, 400)
            return ok()

        async def update_weights(request):
            body = await request.json()
            named = serializer.deserialize(body["serialized_named_tensors"][0])
            return status_of(engine.update_weights_from_tensor(named, load_format=body.get("load_format"),
                                                               flush_cache=body.get("flush_cache", True)))

        async def flush_cache(request):
            return status_of(engine.flush_cache())

        async def session(request):
            return status_of(getattr(engine, request.path.strip("/"))())

        async def fake_calls(request):
            return ok([[c[0], *(x for x in c[1:] if isinstance(x, (str, bool, int, list)) and c[0] != "Engine")]
                       for c in state.calls])

        async def fake_image_data(request):
            return ok(state.image_data)

        @web.middleware
        async def log_requests(request, handler):
            print(request.method, request.path, flush=True)  # the log the engine's start-up errors quote
            return await handler(request)

        app = web.Application(client_max_size=1 << 30, middlewares=[log_requests])
        app.router.add_get("/health", health)
        app.router.add_get("/health_generate", health)
        app.router.add_post("/generate", generate)
        app.router.add_post("/abort_request", abort_request)
        app.router.add_post("/release_memory_occupation", memory)
        app.router.add_post("/resume_memory_occupation", memory)
        app.router.add_post("/update_weights_from_tensor", update_weights)
        app.router.add_route("*", "/flush_cache", flush_cache)
        if hasattr(engine, "begin_weight_update"):
            app.router.add_post("/begin_weight_update", session)
            app.router.add_post("/end_weight_update", session)
        app.router.add_get("/fake_calls", fake_calls)
        app.router.add_get("/fake_image_data", fake_image_data)
        web.run_app(app, host=server_args.host, port=server_args.port, loop=loop, print=None,
                    handle_signals=True)

    return launch_server
