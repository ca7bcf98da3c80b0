"""A recording stand-in for sglang's in-process Engine API (0.5.9–0.5.23 as documented in
/work/shared/reference/engine-apis.md): ServerArgs validation, generate outputs, memory tags, weight-update
sessions and their (success, message) statuses, MultiprocessingSerializer / LocalSerializedTensor, and the HTTP
server over the same Engine (fake_sglang_server.py)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import multiprocessing as mp
import os
import pickle
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import msgspec
from packaging.version import Version

from engine_fakes._install import install, module
from engine_fakes.fake_sglang_server import make_launch_server

GPU_MEMORY_ALL_TYPES = ["kv_cache", "weights", "cuda_graph"]
ENV_SEEN = ("CUDA_VISIBLE_DEVICES", "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK", "SGLANG_BLOCK_NONZERO_RANK_CHILDREN",
            "NCCL_NVLS_ENABLE", "NCCL_GRAPH_REGISTER", "PYTORCH_CUDA_ALLOC_CONF", "SGLANG_MEMORY_SAVER_CUDA_GRAPH",
            "SGLANG_MM_AVOID_RETOKENIZE")
_BASE_FIELDS: list[tuple[str, Any]] = [
    ("model_path", None), ("tokenizer_path", None), ("skip_tokenizer_init", False), ("trust_remote_code", False),
    ("dtype", "auto"), ("load_format", "auto"), ("mem_fraction_static", None), ("enable_memory_saver", False),
    ("enable_weights_cpu_backup", False), ("tp_size", 1), ("dp_size", 1), ("base_gpu_id", 0), ("gpu_id_step", 1),
    ("nnodes", 1), ("node_rank", 0), ("dist_init_addr", None), ("host", "127.0.0.1"), ("port", 30000),
    ("nccl_port", None),
    ("random_seed", None), ("context_length", None), ("max_running_requests", None), ("chunked_prefill_size", None),
    ("disable_cuda_graph", False), ("disable_prefill_cuda_graph", False), ("disable_radix_cache", False),
    ("log_level", "error"),
]


def server_args_class(version: Version) -> type:
    """0.5.20+: a msgspec Struct with cuda_graph_max_bs_decode/_prefill; before: a dataclass with cuda_graph_max_bs."""
    if version.release >= (0, 5, 20):
        extra = [("cuda_graph_max_bs_decode", None), ("cuda_graph_max_bs_prefill", None)]
        return msgspec.defstruct("ServerArgs", [(n, Any, d) for n, d in _BASE_FIELDS + extra], kw_only=True)
    extra = [("cuda_graph_max_bs", None)]
    fields = [(n, Any, dataclasses.field(default=d)) for n, d in _BASE_FIELDS + extra]
    return dataclasses.make_dataclass("ServerArgs", fields)


class MultiprocessingSerializer:
    """CPU stand-in for CUDA-IPC handles: the bytes carry the tensor itself (base64 text with output_str, for HTTP)."""

    @staticmethod
    def serialize(obj, output_str: bool = False) -> bytes | str:
        data = pickle.dumps(obj)
        return base64.b64encode(data).decode() if output_str else data

    @staticmethod
    def deserialize(data: bytes | str):
        return pickle.loads(base64.b64decode(data) if isinstance(data, str) else data)


@dataclass
class LocalSerializedTensor:
    values: list[bytes]

    def get(self, rank: int):
        return MultiprocessingSerializer.deserialize(self.values[rank])


@dataclass
class FlushCacheReqOutput:
    success: bool


def fake_completion(prompt: list[int], sample: int, params: dict) -> tuple[list[int], list[float], str]:
    """Deterministic output of one sample: 1–4 tokens ending in the first stop id, or max_new_tokens at length."""
    base = sum(prompt) + 7 * sample
    stop_ids = params.get("stop_token_ids") or []
    max_new = params["max_new_tokens"]
    length = 1 + base % 4
    if stop_ids and length < max_new:
        tokens = [(base + k) % 20 + 100 for k in range(length - 1)] + [stop_ids[0]]
        reason = "stop"
    else:
        tokens = [(base + k) % 20 + 100 for k in range(max_new)]
        reason = "length"
    return tokens, [-(k + 1) / 10 - sample / 100 for k in range(len(tokens))], reason


@dataclass
class FakeSGLang:
    """Shared state of one fake installation: calls in order, what updates received, failures to inject."""

    version: Version
    calls: list[tuple] = field(default_factory=list)
    engines: list[Any] = field(default_factory=list)
    fail_names: dict[str, str] = field(default_factory=dict)
    abort_samples: dict[int, str] = field(default_factory=dict)
    patch_calls: int = 0
    start_error: str | None = None
    requires_session: bool = False
    undo: Any = None
    #: (prompt ids, sample index, sampling params) -> (tokens, log-probs, finish reason); tests may script it
    completion: Any = fake_completion
    #: prompt ids -> event-loop rounds an async_generate request takes (requests overtake each other)
    async_rounds: Any = None
    #: seconds each of those rounds takes (0: one event-loop iteration)
    round_s: float = 0.0
    #: the image_data of each async_generate request that had one, by its first request id
    image_data: dict[str, Any] = field(default_factory=dict)

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def _engine_class(state: FakeSGLang, server_args_cls: type) -> type:
    class Engine:
        def __init__(self, **kwargs):
            server_args_cls(**kwargs)  # unknown keywords raise TypeError, like ServerArgs(**kwargs)
            if state.start_error:
                raise RuntimeError(state.start_error)
            if (os.environ.get("SGLANG_MEMORY_SAVER_CUDA_GRAPH") == "1" and kwargs.get("enable_memory_saver")
                    and not kwargs.get("disable_cuda_graph") and not kwargs.get("disable_prefill_cuda_graph")):
                raise NotImplementedError("Breakable CUDA graph is not compatible with memory saver mode")  # 0.5.17
            state.calls.append(("Engine", dict(kwargs), {k: os.environ.get(k) for k in ENV_SEEN}))
            os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] = "8"
            os.environ.setdefault("NCCL_CUMEM_ENABLE", "0")
            os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
            mp.set_start_method("spawn", force=True)
            self.kwargs = kwargs
            self.loop = asyncio.new_event_loop()  # like Engine: the loop its sync methods run on
            self.released: set[str] = set()
            self.session_open = False
            self.received: list[list[tuple[str, Any]]] = []
            self.tokenizer_manager = SimpleNamespace(abort_request=self._abort_request)
            self.running: set[str] = set()
            self.aborted: set[str] = set()
            self.samples_started = 0
            state.engines.append(self)

        def _abort_request(self, rid: str = "", abort_all: bool = False):
            """TokenizerManager.abort_request: sends AbortReq(rid, abort_all) to the scheduler, which finishes the
            request(s) with finish reason abort; the waiting async_generate then returns what they had."""
            state.calls.append(("abort_request", rid, abort_all))
            self.aborted.update(self.running if abort_all else {rid} & self.running)

        def _clipped(self, prompt, sampling_params: dict) -> dict:
            """SGLang's scheduler: max_new_tokens ≤ context_length - len(prompt) - 2 (its max_req_len is
            context_length - 1, less one more token)."""
            context = self.kwargs.get("context_length")
            if context is None:
                return sampling_params
            return {**sampling_params,
                    "max_new_tokens": min(sampling_params["max_new_tokens"], context - len(prompt) - 2)}

        def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False, **kwargs):
            state.calls.append(("generate", [list(p) for p in input_ids], dict(sampling_params), return_logprob))
            if self.released:
                raise RuntimeError(f"generate while {sorted(self.released)} are released")
            outputs = []
            for p in input_ids:
                for s in range(sampling_params.get("n", 1)):
                    tokens, lps, reason = state.completion(p, s, self._clipped(p, sampling_params))
                    finish = {"type": reason}
                    if len(outputs) in state.abort_samples:
                        finish = {"type": "abort", "message": state.abort_samples[len(outputs)]}
                    meta = {"id": f"r{len(outputs)}", "prompt_tokens": len(p), "completion_tokens": len(tokens),
                            "cached_tokens": 0, "finish_reason": finish}
                    if return_logprob:
                        meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(lps, tokens)]
                    outputs.append({"text": "", "output_ids": tokens, "meta_info": meta})
            return outputs

        async def async_generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                                 rid=None, **kwargs):
            """One prompt (input_ids: list[int]) → one output dict, or a list of n for sampling_params n > 1 (each
            sample with its own request id: rid a list of n, or the engine's own), like Engine.async_generate; it
            must run on the engine's own loop (the tokenizer manager is bound to it). A request takes
            state.async_rounds(ids) event-loop rounds (1 by default), producing its tokens evenly over them; aborted,
            it returns the tokens produced so far with finish reason abort. state.abort_samples names samples, in
            the order they started, that the engine aborts itself."""
            n = sampling_params.get("n", 1)
            state.calls.append(("async_generate", list(input_ids), dict(sampling_params), return_logprob, rid))
            if asyncio.get_running_loop() is not self.loop:
                raise RuntimeError("async_generate awaited outside the engine's event loop")
            if self.released:
                raise RuntimeError(f"generate while {sorted(self.released)} are released")
            if isinstance(rid, list):
                rids = list(rid)
            else:
                rids = [rid] if n == 1 and rid else [f"auto-{len(state.calls)}-{j}" for j in range(n)]
            if len(rids) != n:
                raise ValueError(f"rid has {len(rids)} entries for n={n}")
            if kwargs.get("image_data") is not None:
                state.image_data[rids[0]] = kwargs["image_data"]
            params = self._clipped(input_ids, {**sampling_params, "n": 1})
            samples = []
            for j in range(n):
                refused = state.abort_samples.get(self.samples_started)
                self.samples_started += 1
                samples.append((rids[j], *state.completion(list(input_ids), j, params), refused))
            self.running.update(rids)
            rounds = state.async_rounds(list(input_ids)) if state.async_rounds else 1
            done = 0
            while done < rounds and not set(rids) <= self.aborted:
                await asyncio.sleep(state.round_s)
                done += 1
            self.running.difference_update(rids)
            outputs = [self._output(sample, done, rounds, return_logprob) for sample in samples]
            self.aborted.difference_update(rids)
            return outputs if n > 1 else outputs[0]

        def _output(self, sample, done: int, rounds: int, return_logprob: bool) -> dict:
            rid, tokens, lps, reason, refused = sample
            finish = {"type": reason}
            if refused is not None:
                tokens, lps, finish = [], [], {"type": "abort", "message": refused}
            elif rid in self.aborted:
                keep = len(tokens) * done // rounds
                tokens, lps, finish = tokens[:keep], lps[:keep], {"type": "abort", "message": "aborted by request"}
            meta = {"id": rid, "prompt_tokens": 0, "completion_tokens": len(tokens), "cached_tokens": 0,
                    "finish_reason": finish}
            if return_logprob:
                meta["output_token_logprobs"] = [(lp, t, None) for lp, t in zip(lps, tokens)]
            return {"text": "", "output_ids": tokens, "meta_info": meta}

        def release_memory_occupation(self, tags=None):
            tags = list(GPU_MEMORY_ALL_TYPES) if tags is None else list(tags)
            state.calls.append(("release_memory_occupation", tags))
            self.released.update(tags)

        def resume_memory_occupation(self, tags=None):
            tags = list(GPU_MEMORY_ALL_TYPES) if tags is None else list(tags)
            state.calls.append(("resume_memory_occupation", tags))
            for t in tags:
                if t not in self.released:
                    raise RuntimeError(f"resume of memory tag {t!r} that was not released")
            self.released.difference_update(tags)

        def update_weights_from_tensor(self, named_tensors, load_format=None, flush_cache=True):
            names = [n for n, _ in named_tensors]
            state.calls.append(("update_weights_from_tensor", names, load_format, flush_cache))
            if state.requires_session and not self.session_open:
                return False, "update_weights_from_tensor requires an open weight-update session"
            if "weights" in self.released:
                return False, "weights are released"
            for name in names:
                if name in state.fail_names:
                    return False, state.fail_names[name]
            self.received.append(
                [(n, [t.get(r) for r in range(len(t.values))] if isinstance(t, LocalSerializedTensor) else t.clone())
                 for n, t in named_tensors]
            )
            return True, "Success"

        def flush_cache(self):
            state.calls.append(("flush_cache",))
            return FlushCacheReqOutput(success=True)

        def shutdown(self):
            state.calls.append(("shutdown",))

    if state.requires_session:

        def begin_weight_update(self, selector: str = "all"):
            state.calls.append(("begin_weight_update",))
            if self.session_open:
                return False, "begin_weight_update called while a weight-update session is already open"
            self.session_open = True
            return True, "Success"

        def end_weight_update(self):
            state.calls.append(("end_weight_update",))
            self.session_open = False
            return True, "Success"

        Engine.begin_weight_update = begin_weight_update
        Engine.end_weight_update = end_weight_update
    return Engine


def install_fake_sglang(version: str, dist_dir: str, requires_session: bool | None = None) -> FakeSGLang:
    """`requires_session` overrides the release's behaviour (0.5.21+ refuses updates outside a session)."""
    parsed = Version(version)
    state = FakeSGLang(parsed)
    state.requires_session = parsed.release >= (0, 5, 21) if requires_session is None else requires_session
    server_args_cls = server_args_class(parsed)

    def monkey_patch_torch_reductions():
        state.patch_calls += 1

    engine_cls = _engine_class(state, server_args_cls)
    modules = {
        "sglang": module("sglang", Engine=engine_cls, __version__=version),
        "sglang.srt": module("sglang.srt"),
        "sglang.srt.server_args": module("sglang.srt.server_args", ServerArgs=server_args_cls),
        "sglang.srt.utils": module("sglang.srt.utils", MultiprocessingSerializer=MultiprocessingSerializer),
        "sglang.srt.utils.patch_torch": module(
            "sglang.srt.utils.patch_torch", monkey_patch_torch_reductions=monkey_patch_torch_reductions
        ),
        "sglang.srt.constants": module("sglang.srt.constants", GPU_MEMORY_ALL_TYPES=list(GPU_MEMORY_ALL_TYPES)),
        "sglang.srt.model_executor": module("sglang.srt.model_executor"),
        "sglang.srt.entrypoints": module("sglang.srt.entrypoints"),
        "sglang.srt.entrypoints.http_server": module(
            "sglang.srt.entrypoints.http_server",
            launch_server=make_launch_server(state, engine_cls, MultiprocessingSerializer)),
    }
    # LocalSerializedTensor moved from model_runner to model_runner_components.weight_updater (0.5.17 has it there)
    if parsed.release >= (0, 5, 17):
        modules["sglang.srt.model_executor.model_runner_components"] = module(
            "sglang.srt.model_executor.model_runner_components")
        modules["sglang.srt.model_executor.model_runner_components.weight_updater"] = module(
            "sglang.srt.model_executor.model_runner_components.weight_updater",
            LocalSerializedTensor=LocalSerializedTensor)
    else:
        modules["sglang.srt.model_executor.model_runner"] = module(
            "sglang.srt.model_executor.model_runner", LocalSerializedTensor=LocalSerializedTensor)
    state.undo = install("sglang", version, modules, dist_dir)
    return state
