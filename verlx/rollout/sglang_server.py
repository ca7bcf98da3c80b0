"""Server mode of the sglang engine (actor_rollout_ref.rollout.server.enable): each engine replica is SGLang's own
HTTP server, one process per replica on its node, started by the replica's first rank with the arguments an
in-process Engine would get, health-checked before its first call and stopped with the worker.

`SGLangServer` is the part of sglang.Engine's API verlx uses, over that server's HTTP endpoints: /generate (one
request per call, on this process's event loop), /abort_request, /release_memory_occupation and
/resume_memory_occupation, /update_weights_from_tensor (CUDA-IPC handles, as in-process: SGLang's TP rank i opens
handle i), /flush_cache, /begin_weight_update and /end_weight_update. So the engine adapter and its request stream
are the same in both modes. While the rollout runs, the server also answers an agent framework's own requests.

`python -m verlx.rollout.sglang_server '<ServerArgs as JSON>'` is the server process.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

#: seconds between two health checks of a starting server
HEALTH_POLL_S = 0.5
#: seconds a control call (release, resume, weights, flush) may take
CONTROL_TIMEOUT_S = 600.0
LOG_TAIL_LINES = 20


class ServerStartError(RuntimeError):
    """An engine server did not come up: where it was to listen, what its log says and what to check."""


def launch_sglang_server(server_args: dict[str, Any], env: dict[str, str], timeout_s: float, rank: int,
                         tp_size: int) -> SGLangServer:
    """Start the server process (its output goes to a log file), wait until it answers /health_generate, and return
    its client; on failure the process is stopped and ServerStartError names the port and the log's last lines."""
    host, port = server_args["host"], int(server_args["port"])
    log_path = os.path.join(tempfile.gettempdir(), f"verlx_sglang_server_rank{rank}_port{port}.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen([sys.executable, "-m", "verlx.rollout.sglang_server", json.dumps(server_args)],
                                   stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **env},
                                   preexec_fn=_die_with_parent)
    server = SGLangServer(f"http://{_url_host(host)}:{port}", process, log_path, tp_size)
    try:
        server.wait_healthy(timeout_s, rank)
    except BaseException:
        server.shutdown()
        raise
    return server


class SGLangServer:
    """A running SGLang HTTP server, driven like an in-process sglang.Engine."""

    def __init__(self, url: str, process: subprocess.Popen, log_path: str, tp_size: int):
        self.url, self.process, self.log_path, self.tp_size = url, process, log_path, tp_size
        #: the loop this process's requests to the server run on (the request stream steps it)
        self.loop = asyncio.new_event_loop()
        #: sglang.Engine.tokenizer_manager.abort_request's counterpart
        self.tokenizer_manager = SimpleNamespace(abort_request=self._abort_request)
        self._session = None
        atexit.register(self.shutdown)

    # ------------------------------------------------------------------ lifecycle
    def wait_healthy(self, timeout_s: float, rank: int) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise self._start_error(rank, f"its process exited with code {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.url}/health_generate", timeout=HEALTH_POLL_S * 4) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(HEALTH_POLL_S)
        raise self._start_error(rank, f"it did not answer {self.url}/health_generate within {timeout_s:g}s")

    def _start_error(self, rank: int, what: str) -> ServerStartError:
        port = self.url.rsplit(":", 1)[1]
        return ServerStartError(
            f"the sglang server of rollout rank {rank} did not come up on {self.url}: {what}. The last lines of its "
            f"log {self.log_path}:\n{_tail(self.log_path)}\nCheck that port {port} is free (another server or an "
            f"earlier run may hold it: `lsof -i :{port}`; set actor_rollout_ref.rollout.server.port), that the GPU "
            "has the memory actor_rollout_ref.rollout.gpu_memory_utilization asks for and the model loads (the log "
            "above), or give a slow start more time with actor_rollout_ref.rollout.server.startup_timeout_s")

    def shutdown(self) -> None:
        """Stop the server (SGLang stops its scheduler processes with it) and this client's connections."""
        if self._session is not None and not self.loop.is_closed():
            self.loop.run_until_complete(self._session.close())
            self._session = None
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    # ------------------------------------------------------------------ generation
    async def async_generate(self, input_ids: list[int], sampling_params: dict, return_logprob: bool = False,
                             rid: str | list[str] | None = None) -> dict | list[dict]:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        payload = {"input_ids": input_ids, "sampling_params": sampling_params, "return_logprob": return_logprob,
                   "rid": rid}
        async with self._session.post(f"{self.url}/generate", json=payload) as response:
            body = await response.text()
            if response.status != 200:
                raise RuntimeError(f"sglang server {self.url}/generate answered {response.status}: {body[:500]}")
            return json.loads(body)

    def _abort_request(self, rid: str = "", abort_all: bool = False) -> None:
        self._post("abort_request", {"rid": rid, "abort_all": abort_all})

    # ------------------------------------------------------------------ memory and weights
    def release_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._post("release_memory_occupation", {"tags": tags})

    def resume_memory_occupation(self, tags: list[str] | None = None) -> None:
        self._post("resume_memory_occupation", {"tags": tags})

    def update_weights_from_tensor(self, named_tensors: list, load_format: str | None = None,
                                   flush_cache: bool = True) -> tuple[bool, str]:
        """The handles of every TP rank in one message per rank, as sglang.Engine sends them to its schedulers."""
        from sglang.srt.utils import MultiprocessingSerializer

        serialized = [MultiprocessingSerializer.serialize(named_tensors, output_str=True)
                      for _ in range(self.tp_size)]
        return self._status("update_weights_from_tensor", {"serialized_named_tensors": serialized,
                                                           "load_format": load_format, "flush_cache": flush_cache})

    def flush_cache(self) -> tuple[bool, str]:
        return self._status("flush_cache", None)

    def begin_weight_update(self) -> tuple[bool, str]:
        return self._status("begin_weight_update", {})

    def end_weight_update(self) -> tuple[bool, str]:
        return self._status("end_weight_update", {})

    # ------------------------------------------------------------------ HTTP
    def _status(self, endpoint: str, payload: dict | None) -> tuple[bool, str]:
        """(success, message) of a control call: a JSON status, or the HTTP status with the body."""
        status, body = self._request(endpoint, payload)
        try:
            answer = json.loads(body)
        except json.JSONDecodeError:
            answer = None
        if isinstance(answer, dict) and "success" in answer:
            return bool(answer["success"]), str(answer.get("message", ""))
        return status == 200, body[:500]

    def _post(self, endpoint: str, payload: dict) -> None:
        status, body = self._request(endpoint, payload)
        if status != 200:
            raise RuntimeError(f"sglang server {self.url}/{endpoint} answered {status}: {body[:500]}")

    def _request(self, endpoint: str, payload: dict | None) -> tuple[int, str]:
        data = None if payload is None else json.dumps(payload).encode()
        request = urllib.request.Request(f"{self.url}/{endpoint}", data=data,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=CONTROL_TIMEOUT_S) as response:
                return response.status, response.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()


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


def main() -> None:
    """The server process: SGLang's HTTP server with the ServerArgs given as JSON (started by verlx's server-mode
    rollout, rollout.server.enable=true; not a command users run themselves)."""
    import argparse

    parser = argparse.ArgumentParser(description="SGLang's HTTP server for verlx's server-mode rollout "
                                     "(actor_rollout_ref.rollout.server.enable=true starts one per engine replica).")
    parser.add_argument("server_args", help="sglang ServerArgs as a JSON object")
    args = parser.parse_args()
    try:
        from sglang.srt.entrypoints.http_server import launch_server
        from sglang.srt.server_args import ServerArgs
    except ImportError as e:
        parser.exit(2, f"error: the SGLang server needs sglang ({e}); install it with pip install 'verlx[sglang]'\n")
    launch_server(ServerArgs(**json.loads(args.server_args)))


if __name__ == "__main__":
    main()
