"""The HTTP server of the vllm stand-in, behaving as vLLM 0.26.0's OpenAI-compatible server (read from its source:
vllm/entrypoints/openai/api_server.py, scale_out/token_in_token_out, serve/dev/*) over the stand-in's LLM and
LLMEngine (fake_vllm.py):
- `make_arg_parser(parser).parse_args([])` gives `vllm serve`'s defaults (EngineArgs' fields, host, port);
  `run_server(args)` builds the engine from EngineArgs' fields of args (EngineArgs.from_cli_args) and serves.
- GET /health; POST /inference/v1/generate: {request_id, token_ids, sampling_params (n, output_kind...)} → one
  answer when every sample finished, {"request_id": "generate-tokens-<request_id>", "choices": [{"index",
  "token_ids", "finish_reason", "logprobs": {"content": [{"token": "token_id:<id>", "logprob"}]}}]}; the n samples
  run as n engine requests (vLLM's parallel sampling); a FINAL_ONLY or CUMULATIVE request answers with all its
  tokens, a DELTA one with the last step's only (what a non-streaming request gets from vLLM).
- with VLLM_SERVER_DEV_MODE=1 only (else 404): POST /abort_requests {"request_ids": [names]} (empty: all), each
  aborted request answering with the tokens it had, finish reason "abort"; POST /sleep?level= (aborts what runs);
  POST /wake_up?tags=...; GET /is_sleeping; POST /reset_prefix_cache → {"success"}; POST /collective_rpc {"method",
  "args", "kwargs"} → {"results": [one per worker]} (results other than None, dict or list as str), the workers
  being vLLM's with `worker_extension_cls` mixed in (refused if it shadows a worker attribute, as vLLM does).
- the engine does not step while asleep; a request sent while asleep is refused (vLLM would hold it until woken).
- GET /fake_calls (test-only): what the engine was asked, for a test in another process.

`write_importable_package(site_dir)` writes a `vllm` package that installs the stand-in when a subprocess imports it
(with site_dir and tests/ on its PYTHONPATH and FAKE_VLLM_VERSION, FAKE_VLLM_DIST in its environment;
FAKE_VLLM_START_ERROR makes the engine fail to start, FAKE_VLLM_STEP_S sets the seconds per engine step,
FAKE_VLLM_ONE_STEP_PER_TOKEN makes a request take one step per token, FAKE_VLLM_STALL_AFTER=k stops every request
after k steps until it is aborted, FAKE_VLLM_HOLD_UNTIL=k holds the engine's first step until k requests are in
flight (at most HOLD_LIMIT_S) and records how many were ("in_flight_at_first_step", count), FAKE_VLLM_COMPLETION names
a `module:function` making the tokens).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import os

import torch

from engine_fakes.fake_http_server import FakeHTTPServer
from engine_fakes.fake_http_server import write_importable_package as write_package

SHIM = '''"""The recording stand-in of vllm for a subprocess (tests/engine_fakes/fake_vllm_server.py)."""
import importlib
import os

from engine_fakes.fake_vllm import install_fake_vllm

state = install_fake_vllm(os.environ["FAKE_VLLM_VERSION"], os.environ["FAKE_VLLM_DIST"])
state.start_error = os.environ.get("FAKE_VLLM_START_ERROR") or None
state.server_step_s = float(os.environ.get("FAKE_VLLM_STEP_S", "0"))
if os.environ.get("FAKE_VLLM_ONE_STEP_PER_TOKEN"):
    state.steps_of = lambda tokens: max(1, tokens)
if os.environ.get("FAKE_VLLM_STALL_AFTER"):
    state.stall_after = int(os.environ["FAKE_VLLM_STALL_AFTER"])
if os.environ.get("FAKE_VLLM_HOLD_UNTIL"):
    state.hold_until = int(os.environ["FAKE_VLLM_HOLD_UNTIL"])
if os.environ.get("FAKE_VLLM_COMPLETION"):
    module, name = os.environ["FAKE_VLLM_COMPLETION"].split(":")
    state.completion = getattr(importlib.import_module(module), name)
'''
TOKENS_PREFIX = "generate-tokens-"
DEV_MODE = "VLLM_SERVER_DEV_MODE"
#: the longest FAKE_VLLM_HOLD_UNTIL waits for its requests
HOLD_LIMIT_S = 10.0
#: the server process's environment a test checks
SERVER_ENV_SEEN = (DEV_MODE, "VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_WORKER_MULTIPROC_METHOD", "CUDA_VISIBLE_DEVICES",
                   "NCCL_NVLS_ENABLE", "PYTORCH_CUDA_ALLOC_CONF")


def write_importable_package(site_dir: str) -> str:
    return write_package(site_dir, "vllm", SHIM)


class FlexibleArgumentParser(argparse.ArgumentParser):
    """vllm.utils.argparse_utils.FlexibleArgumentParser."""


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`vllm serve`'s options: every EngineArgs field, and the frontend's host and port."""
    from engine_fakes.fake_vllm import EngineArgs

    for field in dataclasses.fields(EngineArgs):
        parser.add_argument(f"--{field.name.replace('_', '-')}", dest=field.name, default=field.default)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=8000)
    return parser


def validate_parsed_serve_args(args: argparse.Namespace) -> None:
    """vLLM checks its tool and reasoning parsers here; verlx sets neither."""


class _Worker:
    """vLLM's GPU worker as a worker extension sees it: its model runner and its device."""

    def __init__(self, llm, rank: int):
        self.rank = rank
        self.device = torch.device("cpu")
        self.model_runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner


def worker_class(qualname: str) -> type:
    """The worker class with `qualname` mixed in, as vLLM's WorkerWrapperBase does."""
    if not qualname:
        return _Worker
    module, _, name = qualname.rpartition(".")
    extension = getattr(importlib.import_module(module), name)
    for attr in dir(extension):
        if not attr.startswith("__") and hasattr(_Worker, attr):
            raise AssertionError(f"Worker class {_Worker} already has an attribute {attr}, which conflicts with the "
                                 f"worker extension class {extension}.")
    return type("Worker", (_Worker, extension), {})


class FakeVLLMServer(FakeHTTPServer):
    def __init__(self, state, engine_args, dev_mode: bool):
        from engine_fakes.fake_vllm import RequestOutputKind, SamplingParams, TokensPrompt

        self.state, self.dev_mode = state, dev_mode
        self.kinds, self.sampling_class, self.prompt_class = RequestOutputKind, SamplingParams, TokensPrompt
        self.llm = importlib.import_module("vllm").LLM(**dataclasses.asdict(engine_args))
        self.engine = self.llm.llm_engine
        workers = worker_class(engine_args.worker_extension_cls)
        self.workers = [workers(self.llm, rank) for rank in range(engine_args.tensor_parallel_size)]
        self.step_s = state.server_step_s
        state.step_s = 0.0  # the server sleeps between steps without blocking its loop
        self.requests: dict[str, dict] = {}  # external request id -> its samples and its answer's future
        self.child_of: dict[str, tuple[str, int]] = {}  # engine request id -> (external request id, sample index)
        self.work = asyncio.Event()

    # ------------------------------------------------------------------ the engine loop
    async def run(self) -> None:
        """Step while requests make progress; then wait for a new request or a wake-up."""
        if self.state.hold_until:
            await self._hold(self.state.hold_until)
        while True:
            await self.work.wait()
            outputs = self.engine.step() if self.engine.running and not self.llm.sleeping else []
            if not outputs:
                self.work.clear()
            for output in outputs:
                self._deliver(output)
            await asyncio.sleep(self.step_s)

    async def _hold(self, count: int) -> None:
        """No step until `count` requests are in flight, or HOLD_LIMIT_S after the first one came."""
        clock = asyncio.get_running_loop().time
        while not self.requests:
            await asyncio.sleep(0.01)
        deadline = clock() + HOLD_LIMIT_S
        while len(self.requests) < count and clock() < deadline:
            await asyncio.sleep(0.01)
        self.state.calls.append(("in_flight_at_first_step", len(self.requests)))

    def _deliver(self, output) -> None:
        external, index = self.child_of[output.request_id]
        sample = self.requests[external]["samples"][index]
        completion = output.outputs[0]
        lps = [positions[t].logprob for positions, t in zip(completion.logprobs, completion.token_ids)] \
            if completion.logprobs is not None else []
        sample["last"] = (list(completion.token_ids), lps)
        sample["tokens"] += completion.token_ids
        sample["lps"] += lps
        if output.finished:
            del self.child_of[output.request_id]
            sample["reason"] = completion.finish_reason
            self._answer_if_done(external)

    def _answer_if_done(self, external: str) -> None:
        request = self.requests[external]
        if any(sample["reason"] is None for sample in request["samples"]):
            return
        del self.requests[external]
        choices = []
        for index, sample in enumerate(request["samples"]):
            tokens, lps = sample["last"] if request["kind"] is self.kinds.DELTA else (sample["tokens"], sample["lps"])
            logprobs = None
            if request["logprobs"]:
                logprobs = {"content": [{"token": f"token_id:{t}", "logprob": max(lp, -9999.0), "bytes": None,
                                         "top_logprobs": []} for t, lp in zip(tokens, lps)]}
            choices.append({"index": index, "token_ids": tokens, "finish_reason": sample["reason"],
                            "logprobs": logprobs, "routed_experts": None})
        request["future"].set_result({"request_id": external, "model": None, "choices": choices})

    def abort(self, externals) -> int:
        for external in [e for e in externals if e in self.requests]:
            running = [c for c, (e, _) in self.child_of.items() if e == external]
            self.engine.abort_request(running)
            for child in running:
                _, index = self.child_of.pop(child)
                self.requests[external]["samples"][index]["reason"] = "abort"
            self._answer_if_done(external)
        return len(externals)

    # ------------------------------------------------------------------ endpoints
    def routes(self) -> list[tuple[str, str, object]]:
        routes = [("POST", "/inference/v1/generate", self.generate), ("GET", "/fake_calls", self.fake_calls)]
        if self.dev_mode:
            routes += [("POST", "/abort_requests", self.abort_requests), ("POST", "/sleep", self.sleep),
                       ("POST", "/wake_up", self.wake_up), ("GET", "/is_sleeping", self.is_sleeping),
                       ("POST", "/reset_prefix_cache", self.reset_prefix_cache),
                       ("POST", "/collective_rpc", self.collective_rpc)]
        return routes

    async def generate(self, request):
        body = await request.json()
        sampling = dict(body["sampling_params"])
        kind = self.kinds(sampling.pop("output_kind", self.kinds.CUMULATIVE.value))
        try:
            params = self.sampling_class(**sampling)
        except TypeError as e:
            return self.answer({"error": {"message": str(e), "code": 400}}, 400)
        external = TOKENS_PREFIX + body["request_id"]
        n = params.kwargs["n"]
        future = asyncio.get_running_loop().create_future()
        self.requests[external] = {"future": future, "kind": kind, "logprobs": params.kwargs["logprobs"] is not None,
                                   "samples": [{"tokens": [], "lps": [], "last": ([], []), "reason": None}
                                               for _ in range(n)]}
        try:
            for index in range(n):
                child = self.sampling_class(**{**sampling, "n": 1})
                child.output_kind = self.kinds.DELTA
                prompt = self.prompt_class(prompt_token_ids=body["token_ids"])
                self.engine.add_request(f"{index}_{external}", prompt, child)
                self.child_of[f"{index}_{external}"] = (external, index)
        except RuntimeError as e:
            del self.requests[external]
            return self.answer({"error": {"message": str(e), "code": 400}}, 400)
        self.work.set()
        return self.answer(await future)

    async def abort_requests(self, request):
        ids = (await request.json()).get("request_ids")
        self.state.calls.append(("abort_requests", ids))
        ids = ids or list(self.requests)
        return self.answer({"status": "aborted", "aborted": self.abort(ids)})

    async def sleep(self, request):
        self.abort(list(self.requests))  # mode=abort, the default
        self.llm.sleep(level=int(request.query.get("level", "1")))
        return self.answer()

    async def wake_up(self, request):
        self.llm.wake_up(tags=request.query.getall("tags", []) or None)
        self.work.set()
        return self.answer()

    async def is_sleeping(self, request):
        return self.answer({"is_sleeping": bool(self.llm.sleeping)})

    async def reset_prefix_cache(self, request):
        return self.answer({"success": bool(self.llm.reset_prefix_cache())})

    async def collective_rpc(self, request):
        body = await request.json()
        method = body.get("method")
        if method is None:
            return self.answer({"detail": "Missing 'method' in request body"}, 400)
        try:
            results = [getattr(w, method)(*body.get("args", []), **body.get("kwargs", {})) for w in self.workers]
        except Exception as e:  # vLLM's engine core fails the call; the server answers 500
            return self.answer({"error": {"message": f"{type(e).__name__}: {e}", "code": 500}}, 500)
        self.state.calls.append(("collective_rpc", method, results))
        return self.answer({"results": [r if r is None or isinstance(r, (dict, list)) else str(r) for r in results]})

    async def fake_calls(self, request):
        return self.answer(self.state.calls)


def make_run_server(state):
    async def run_server(args, **uvicorn_kwargs) -> None:
        from engine_fakes.fake_vllm import EngineArgs

        if state.start_error:
            raise RuntimeError(state.start_error)
        state.calls.append(("server", {k: os.environ.get(k) for k in SERVER_ENV_SEEN}))
        engine_args = EngineArgs(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EngineArgs)})
        await FakeVLLMServer(state, engine_args, os.environ.get(DEV_MODE) == "1").serve(args.host, args.port)

    return run_server
