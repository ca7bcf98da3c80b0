"""Stand-ins of the HTTP services veRL's tools call, on a free local port, for the tool tests:
- SandboxFusion's POST /run_code (as its API answers: {"status": "Success"|"Failed", "run_result": {"status":
  "Finished"|"TimeLimitExceeded", "stdout", "stderr", "return_code", "execution_time"}}), running Python code for
  real in a child process with the request's run_timeout; other languages answer "SandboxError";
- a Search-R1 style retrieval server's POST /retrieve ({"queries", "topk", "return_scores"} → {"result": [[{"document":
  {"id", "contents": "Title\\ntext"}, "score"}, ...] per query]}) over a fixed corpus, a passage matching a query when
  its title is a word of the query;
- POST /status/<code>[/<service>]: answers that HTTP status (failures_left times, then as /<service>, run_code unless
  named), /slow/<s>[/<service>]: answers as /<service> after s seconds, /not_json: a 200 whose body is not JSON.
Every request body is recorded (`requests`), with its path.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CORPUS = ["Paris\nParis is the capital of France.", "France\nFrance is a country in Europe.",
          "Europe\nEurope is a continent.\nIt has 44 countries.", "Berlin\nBerlin is the capital of Germany."]


def run_code(request: dict) -> dict:
    if request.get("language") != "python":
        return {"status": "SandboxError", "message": f"language {request.get('language')} is not served here"}
    try:
        done = subprocess.run([sys.executable, "-I", "-c", request["code"]], capture_output=True, text=True,
                              timeout=request["run_timeout"], input=request.get("stdin") or "")
    except subprocess.TimeoutExpired:
        return {"status": "Failed", "run_result": {"status": "TimeLimitExceeded", "stdout": "", "stderr": "",
                                                   "return_code": None, "execution_time": request["run_timeout"]}}
    return {"status": "Success" if done.returncode == 0 else "Failed",
            "run_result": {"status": "Finished", "stdout": done.stdout, "stderr": done.stderr,
                           "return_code": done.returncode, "execution_time": 0.01}}


def retrieve(request: dict) -> dict:
    per_query = []
    for query in request["queries"]:
        words = set(query.replace("?", "").split())
        hits = [{"document": {"id": str(i), "contents": doc}, "score": 1.0}
                for i, doc in enumerate(CORPUS) if doc.split("\n")[0] in words]
        per_query.append(hits[: request["topk"]])
    return {"result": per_query}


SERVICES = {"run_code": run_code, "retrieve": retrieve}


class ToolServices:
    def __init__(self, failures: int = 10**9):
        self.requests: list[tuple[str, dict]] = []
        self.failures_left = failures
        services = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                services.requests.append((self.path, body))
                parts = self.path.strip("/").split("/")
                if parts[0] == "status" and services.failures_left > 0:
                    services.failures_left -= 1
                    self.send_error(int(parts[1]))
                    return
                if parts[0] == "slow":
                    time.sleep(float(parts[1]))
                service = (parts[2] if len(parts) > 2 else "run_code") if parts[0] in ("status", "slow") else parts[0]
                if service == "not_json":
                    self._answer(b"<html>busy</html>")
                elif service in SERVICES:
                    self._answer(json.dumps(SERVICES[service](body)).encode())
                else:
                    self.send_error(404)

            def _answer(self, data: bytes):
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # the client gave up first
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> ToolServices:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
