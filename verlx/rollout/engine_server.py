"""What server mode (actor_rollout_ref.rollout.server.enable) does the same for every engine: start the engine's HTTP
server as a process of its own (its output in a log file, stopped when the worker that started it dies), wait until
it answers its health check, name the port, the log's last lines and what to check when it does not, send it
requests (control calls blocking, generation requests as coroutines on the client's own event loop), and stop it.

Its log (`verlx_<engine>_server_rank<R>_port<P>.log` in actor_rollout_ref.rollout.server.log_dir, kept there; by
default in $TMPDIR) is removed when verlx stops a running server cleanly
(`shutdown()`, which a run's end reaches through Worker.close), and kept wherever it may explain something: a server
that did not come up (ServerStartError names it), a start that raised after the server came up
(`shutdown(keep_log=True)`), a server process that exited on its own (the request that found it gone raises
ServerExitedError naming its exit code and log; shutdown warns with the path), a request whose connection to the
running server failed without an answer (ServerDisconnectedError names the log), a stop that raised, and a server
stopped only by the interpreter's exit (no one called shutdown: an uncaught error may be why).

`EngineServer` is that client; sglang_server.py and vllm_server.py add each engine's endpoints and its server
process (`python -m <module> '<server arguments as JSON>'`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Any, ClassVar

from verlx.utils.errors import VerlxError
from verlx.utils.paths import expand_path

#: seconds between two health checks of a starting server
HEALTH_POLL_S = 0.5
#: seconds a control call (sleep, wake, weights, caches) may take
CONTROL_TIMEOUT_S = 600.0
LOG_TAIL_LINES = 20
#: seconds a failed connection waits for the server process to be seen exited
EXIT_WAIT_S = 1.0
#: the same for a generation request's failed connection: a crashing SGLang server tears its process tree down after
#: its scheduler died, which takes longer than a refused connection's server to be gone
DISCONNECT_EXIT_WAIT_S = 10.0

logger = logging.getLogger(__name__)


class ServerStartError(VerlxError, RuntimeError):
    """An engine server did not come up: where it was to listen, what its log says and what to check."""


class ServerExitedError(VerlxError, RuntimeError):
    """A running engine server's process exited on its own: its exit code and its log (kept)."""


class ServerDisconnectedError(VerlxError, RuntimeError):
    """A request's connection to a running engine server failed without an answer (closed, reset, broken) and
    the server's process still runs: the error and the server's log (kept)."""


def server_port(layout, configured: int | None) -> int:
    """The replica's port: its engine port block's first (layout.port), or rollout.server.port + its index among
    the replicas of its node."""
    if configured is None:
        return layout.port
    return int(configured) + layout.node_peer_ranks[0] % layout.n_gpus_per_node // layout.tp_size


def server_environment(env: dict[str, str | None]) -> dict[str, str]:
    """The worker's environment with the engine's variables on top (None: removed), and the directory verlx is
    imported from first on PYTHONPATH: the server process runs verlx's module, and the engine's own processes may
    import verlx code (vLLM's worker extension), whatever directory the worker runs in."""
    import verlx

    merged = {k: v for k, v in {**os.environ, **env}.items() if v is not None}
    source = os.path.dirname(os.path.dirname(os.path.abspath(verlx.__file__)))
    merged["PYTHONPATH"] = os.pathsep.join(p for p in (source, merged.get("PYTHONPATH")) if p)
    return merged


class EngineServer:
    """A running engine HTTP server."""

    #: the engine's name in messages and log file names
    engine: ClassVar[str]
    #: the module whose main() is the server process
    module: ClassVar[str]
    #: answers 200 once the server can generate
    health_path: ClassVar[str]

    @classmethod
    def launch(cls, server_args: dict[str, Any], env: dict[str, str], timeout_s: float, rank: int,
               log_dir: str | None = None, **client_args) -> EngineServer:
        """Start the server process, wait until it answers its health check, and return its client; on failure the
        process is stopped, its log kept, and ServerStartError names the port, the log and its last lines. A log in
        `log_dir` (rollout.server.log_dir) is kept in any case."""
        host, port = server_args["host"], int(server_args["port"])
        directory = expand_path(log_dir, absolute=True) if log_dir else tempfile.gettempdir()
        os.makedirs(directory, exist_ok=True)
        log_path = os.path.join(directory, f"verlx_{cls.engine}_server_rank{rank}_port{port}.log")
        with open(log_path, "w") as log:
            process = subprocess.Popen([sys.executable, "-m", cls.module, json.dumps(server_args)], stdout=log,
                                       stderr=subprocess.STDOUT, env=env, preexec_fn=_die_with_parent)
        server = cls(f"http://{_url_host(host)}:{port}", process, log_path, **client_args)
        server._keep_log = bool(log_dir)
        try:
            server.wait_healthy(timeout_s, rank)
        except BaseException:
            server.shutdown(keep_log=True)
            raise
        return server

    def __init__(self, url: str, process: subprocess.Popen, log_path: str):
        self.url, self.process, self.log_path = url, process, log_path
        #: the loop this process's generation requests to the server run on (the request stream steps it)
        self.loop = asyncio.new_event_loop()
        self._session = None
        self._stopped = False
        #: the stop keeps the log: it is in rollout.server.log_dir (set by `launch`), or a failure named it
        self._keep_log = False
        atexit.register(self._stop_at_exit)

    # ------------------------------------------------------------------ lifecycle
    def wait_healthy(self, timeout_s: float, rank: int) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._start_error(rank, f"its process exited with code {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}{self.health_path}", timeout=HEALTH_POLL_S * 4) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(HEALTH_POLL_S)
        raise self._start_error(rank, f"it did not answer {self.url}{self.health_path} within {timeout_s:g}s")

    def _start_error(self, rank: int, what: str) -> ServerStartError:
        port = self.url.rsplit(":", 1)[1]
        return ServerStartError(
            f"the {self.engine} server of rollout rank {rank} did not come up on {self.url}: {what}. The last lines of "
            f"its log {self.log_path}:\n{_tail(self.log_path)}\nCheck that port {port} is free (another server or an "
            f"earlier run may hold it: `lsof -i :{port}`; set actor_rollout_ref.rollout.server.port), that the GPU "
            "has the memory actor_rollout_ref.rollout.gpu_memory_utilization asks for and the model loads (the log "
            "above), or give a slow start more time with actor_rollout_ref.rollout.server.startup_timeout_s")

    def shutdown(self, keep_log: bool = False) -> None:
        """Stop the server (the engine stops its own child processes with it) and this client's connections; once.
        The log is removed only when verlx stopped a running server without error and `keep_log` is off (a start
        that failed after the server came up passes it); a process that had exited on its own keeps its log, named
        in a warning."""
        if self._stopped:
            return
        if self._session is not None and not self.loop.is_closed():
            self.loop.run_until_complete(self._session.close())
            self._session = None
        exited_on_its_own = self.process.poll() is not None
        if exited_on_its_own:
            logger.warning("the %s server %s had exited on its own with code %s before verlx stopped it; its log "
                           "is kept: %s", self.engine, self.url, self.process.returncode, self.log_path)
        else:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._stopped = True
        atexit.unregister(self._stop_at_exit)
        if not (keep_log or self._keep_log or exited_on_its_own):
            with contextlib.suppress(FileNotFoundError):
                os.remove(self.log_path)

    def _stop_at_exit(self) -> None:
        """The interpreter exits without anyone having stopped the server (an uncaught error may be why)."""
        self.shutdown(keep_log=True)

    def _exited_error(self, endpoint: str, exit_code: int) -> ServerExitedError:
        return ServerExitedError(
            f"the {self.engine} server {self.url} exited on its own with code {exit_code} (found calling /{endpoint}); "
            f"the last lines of its log {self.log_path} (kept):\n{_tail(self.log_path)}")

    def _exit_code(self) -> int | None:
        """The server process's exit code once a connection failed, or None if it is still running."""
        try:
            return self.process.wait(timeout=EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            return None

    # ------------------------------------------------------------------ HTTP
    async def _post_json(self, endpoint: str, payload: dict) -> Any:
        """A generation request on `loop`: the answer's JSON, or RuntimeError with the status and body. A connection
        that fails names the server's exit code once its process is gone, else the failure, and keeps its log."""
        import aiohttp

        if self._session is None:
            # A connection per request (force_close): this loop runs only while a step generates, so a kept-alive
            # connection the server closed while idle (uvicorn's keep-alive is 5 s) still looks open to the pool at
            # the next step, and the request written on it fails ("Server disconnected", "Broken pipe"). No cap on
            # connections (limit=0; aiohttp's default holds all but 100 back): every prompt of a batch reaches the
            # engine at once, whose own max_num_seqs / max_running_requests schedules them.
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None),
                                                  connector=aiohttp.TCPConnector(force_close=True, limit=0))
        try:
            async with self._session.post(f"{self.url}/{endpoint}", json=payload) as response:
                body = await response.text()
        except aiohttp.ClientConnectionError as error:
            exit_code = await self._exit_code_async(DISCONNECT_EXIT_WAIT_S)
            if exit_code is not None:
                raise self._exited_error(endpoint, exit_code) from None
            self._keep_log = True
            raise ServerDisconnectedError(
                f"the {self.engine} server {self.url} failed a /{endpoint} request on its connection without "
                f"answering ({type(error).__name__}: {error}), and its process {self.process.pid} still runs; the "
                f"last lines of its log {self.log_path} (kept):\n{_tail(self.log_path)}") from error
        if response.status != 200:
            raise RuntimeError(self._refusal(endpoint, response.status, body))
        return json.loads(body)

    async def _exit_code_async(self, wait_s: float) -> int | None:
        """The server process's exit code within `wait_s`, or None; without blocking the loop the other requests
        run on."""
        deadline = time.monotonic() + wait_s
        while self.process.poll() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return self.process.returncode

    def _call(self, endpoint: str, payload: dict | None = None, method: str = "POST") -> str:
        """A control call: the answer's body, or RuntimeError with the status and body."""
        status, body = self._request(endpoint, payload, method)
        if status != 200:
            raise RuntimeError(self._refusal(endpoint, status, body))
        return body

    def _refusal(self, endpoint: str, status: int, body: str) -> str:
        return f"{self.engine} server {self.url}/{endpoint} answered {status}: {body[:500]}"

    def _request(self, endpoint: str, payload: dict | None, method: str = "POST") -> tuple[int, str]:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.url}/{endpoint}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT_S) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()
        except (urllib.error.URLError, ConnectionError):
            exit_code = self._exit_code()
            if exit_code is not None:
                raise self._exited_error(endpoint, exit_code) from None
            raise


def _die_with_parent() -> None:
    """In the server process before exec: SIGTERM when the worker that started it dies (Linux), so a killed
    worker leaves no server holding the GPU."""
    with contextlib.suppress(OSError):  # not Linux: the atexit stop still applies
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _tail(path: str) -> str:
    try:
        with open(path, errors="replace") as f:
            lines = f.read().splitlines()[-LOG_TAIL_LINES:]
    except OSError as e:
        return f"    (cannot read it: {e})"
    return "\n".join(f"    {line}" for line in lines) or "    (empty)"
