"""What the vLLM and SGLang stand-in servers (fake_vllm_server.py, fake_sglang_server.py) share: JSON answers, a
health endpoint, the request log their start-up errors quote, serving on a host and port until SIGTERM, and the
package a server subprocess imports to install the stand-in. With FAKE_SERVER_REQUEST_LOG set, the request log
also goes to that file (a test's own copy: verlx removes the server's log after a clean stop). With
FAKE_SERVER_DROP=<path>:<count> the server closes the connection of the first <count> requests to <path> without
answering (what a kept-alive connection the server closed while idle does to the next request on it).
FAKE_SERVER_KEEPALIVE_S=<seconds> the server closes a connection idle this long (uvicorn, which the engines' servers
run on, closes after 5 s; aiohttp's own default is 75 s)."""

from __future__ import annotations

import asyncio
import json
import os
import signal

#: a file the server appends its request log to
REQUEST_LOG_ENV = "FAKE_SERVER_REQUEST_LOG"
#: <path>:<count>: requests to drop unanswered
DROP_ENV = "FAKE_SERVER_DROP"
#: seconds an idle kept-alive connection stays open
KEEPALIVE_ENV = "FAKE_SERVER_KEEPALIVE_S"


class FakeHTTPServer:
    """An engine's HTTP server over its stand-in engine: subclasses name their endpoints (`routes`) and what runs
    beside them (`run`, e.g. the engine loop)."""

    #: the paths answering 200 once the server is up
    health_paths: tuple[str, ...] = ("/health",)

    def routes(self) -> list[tuple[str, str, object]]:
        """(method, path, handler) of each endpoint besides the health check."""
        raise NotImplementedError

    async def run(self) -> None:
        """What runs while the server serves (the default: nothing)."""
        await asyncio.Event().wait()

    @staticmethod
    def answer(payload=None, status: int = 200):
        """An empty answer, or `payload` as JSON (what JSON cannot hold as str)."""
        from aiohttp import web

        if payload is None:
            return web.Response(status=status)
        return web.Response(text=json.dumps(payload, default=str), status=status, content_type="application/json")

    def app(self):
        from aiohttp import web

        async def health(request):
            return self.answer()

        copy = os.environ.get(REQUEST_LOG_ENV)
        drop_path, _, drops = os.environ.get(DROP_ENV, "").partition(":")
        left_to_drop = [int(drops or 0)]

        @web.middleware
        async def log_requests(request, handler):
            print(request.method, request.path_qs, flush=True)  # the log the engine's start-up errors quote
            if copy:
                with open(copy, "a") as f:
                    print(request.method, request.path_qs, file=f)
            if request.path == drop_path and left_to_drop[0] > 0:
                left_to_drop[0] -= 1
                request.transport.close()
                raise asyncio.CancelledError
            return await handler(request)

        app = web.Application(client_max_size=1 << 30, middlewares=[log_requests])
        for path in self.health_paths:
            app.router.add_get(path, health)
        for method, path, handler in self.routes():
            app.router.add_route(method, path, handler)
        return app

    async def serve(self, host: str, port: int) -> None:
        """Serve on host:port (an address in use raises, as the engines' servers do) until SIGTERM or `run` ends."""
        from aiohttp import web

        runner = web.AppRunner(self.app(), keepalive_timeout=float(os.environ.get(KEEPALIVE_ENV, 75.0)))
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
            stop = asyncio.Event()
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
            running, stopping = asyncio.ensure_future(self.run()), asyncio.ensure_future(stop.wait())
            await asyncio.wait([running, stopping], return_when=asyncio.FIRST_COMPLETED)
            for task in (running, stopping):
                task.cancel()
            if running.done() and not running.cancelled():
                running.result()  # what ended the engine loop
        finally:
            await runner.cleanup()


def write_importable_package(site_dir: str, name: str, shim: str) -> str:
    """A package `name` under site_dir whose __init__ is `shim` (it installs the stand-in on import)."""
    os.makedirs(os.path.join(site_dir, name), exist_ok=True)
    with open(os.path.join(site_dir, name, "__init__.py"), "w") as f:
        f.write(shim)
    return site_dir
