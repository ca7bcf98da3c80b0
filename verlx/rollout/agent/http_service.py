"""JSON over HTTP for tools that call a service (veRL's SandboxFusionTool and SearchTool): one POST with a timeout,
every failure an HttpCallError naming the URL, and a thread pool per tool bounding its calls in flight.

The standard library's urllib, no new dependency. Each attempt is bounded by its timeout; a tool's retries sleep on
the event loop, so a caller that gives up (multi_turn.tool_timeout_s) stops the retries as well."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any

HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}


class HttpCallError(Exception):
    """A POST that gave no JSON answer. kind: status (the service answered `status`), timeout, connection, json."""

    def __init__(self, kind: str, message: str, status: int | None = None):
        super().__init__(message)
        self.kind = kind
        self.status = status


def post_json(url: str, payload: Any, timeout_s: float) -> Any:
    """The decoded JSON answer of POST url; raises HttpCallError (the message names the URL)."""
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=HEADERS, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            body = response.read()
    except urllib.error.HTTPError as e:
        kind = "Client" if e.code < 500 else "Server"
        raise HttpCallError("status", f"{e.code} {kind} Error: {e.reason} for url: {url}", e.code) from None
    except TimeoutError:
        raise HttpCallError("timeout", f"no answer from {url} within {timeout_s:g} s") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise HttpCallError("timeout", f"no answer from {url} within {timeout_s:g} s") from None
        raise HttpCallError("connection", f"cannot reach {url}: {e.reason}") from None
    except (ConnectionError, OSError) as e:
        raise HttpCallError("connection", f"cannot reach {url}: {e}") from None
    try:
        return json.loads(body)
    except ValueError as e:
        raise HttpCallError("json", f"{url} answered with no JSON ({e}): {body[:200]!r}") from None


class JsonService:
    """POSTs to one URL from a pool of `concurrency` threads (created at the first call)."""

    def __init__(self, url: str, concurrency: int):
        self.url = url
        self.concurrency = int(concurrency)
        self._pool: ThreadPoolExecutor | None = None

    async def post(self, payload: Any, timeout_s: float) -> Any:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="verlx-http-tool")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, post_json, self.url, payload, timeout_s)
