"""A recording stand-in for vllm's in-process LLM API (0.11–0.33 as documented in
/work/shared/reference/engine-apis.md): EngineArgs validation, SamplingParams (max_tokens defaults to 16),
TokensPrompt, RequestOutput / CompletionOutput / Logprob, sleep levels, wake_up's "fully awake" answer, and a
model whose load_weights fuses q/k/v and gate/up like vLLM's and reports the vLLM names it loaded; and the
OpenAI-compatible HTTP server over the same engine (fake_vllm_server.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import time
from dataclasses import dataclass, field
from enum import Enum
from types import SimpleNamespace
from typing import Any, TypedDict

import torch
from packaging.version import Version
from torch import nn

from engine_fakes._install import install, module
from engine_fakes.fake_sglang import fake_completion
from engine_fakes.fake_vllm_server import (
    FlexibleArgumentParser,
    make_arg_parser,
    make_run_server,
    validate_parsed_serve_args,
)

ENV_SEEN = ("LOCAL_RANK", "VLLM_ENABLE_V1_MULTIPROCESSING", "NCCL_NVLS_ENABLE", "PYTORCH_CUDA_ALLOC_CONF")
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
FUSED_OF = {shard: fused for fused, shards in PACKED.items() for shard in shards}


def vllm_layout(hf_shapes: dict[str, tuple[int, ...]]):
    """vLLM's parameters for a checkpoint's HF names: q/k/v (weights and biases) stacked into qkv_proj and
    gate/up into gate_up_proj, in that order. Returns ({vLLM name: shape}, {HF shard name: (vLLM name, row offset,
    rows)})."""
    shapes: dict[str, tuple[int, ...]] = {}
    shards: dict[str, tuple[str, int, int]] = {}
    order = {shard: i for shards_ in PACKED.values() for i, shard in enumerate(shards_)}
    named = sorted(hf_shapes.items(), key=lambda item: order.get(_shard_of(item[0]) or "", 0))
    for name, shape in named:
        shard = _shard_of(name)
        if shard is None:
            shapes[name] = tuple(shape)
            continue
        target = ".".join(FUSED_OF[shard] if p == shard else p for p in name.split("."))
        offset = shapes[target][0] if target in shapes else 0
        shards[name] = (target, offset, shape[0])
        shapes[target] = (offset + shape[0], *shape[1:])
    return shapes, shards


def _shard_of(name: str) -> str | None:
    return next((p for p in name.split(".") if p in FUSED_OF), None)


def checkpoint_shapes(model_dir: str) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    with safe_open(os.path.join(model_dir, "model.safetensors"), framework="pt") as f:
        names = f.keys()  # a safe_open handle is not iterable
        return {name: tuple(f.get_slice(name).get_shape()) for name in names}


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class FlatLogprobs:
    """vllm.logprobs.FlatLogprobs: every position's entries in flat lists (what a request with flat_logprobs gets);
    len() is the number of positions."""
    start_indices: list[int] = field(default_factory=list)
    end_indices: list[int] = field(default_factory=list)
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ranks: list[int | None] = field(default_factory=list)
    decoded_tokens: list[str | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.start_indices)


def sampled_logprobs(tokens: list[int], lps: list[float], flat: bool) -> list[dict[int, Logprob]] | FlatLogprobs:
    """The sampled tokens' log-probs (logprobs=0) as vLLM's output holds them: a dict per position, or flat."""
    if not flat:
        return [{t: Logprob(lp, 1, None)} for t, lp in zip(tokens, lps)]
    n = len(tokens)
    return FlatLogprobs(list(range(n)), list(range(1, n + 1)), list(tokens), list(lps), [1] * n, [None] * n)


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | FlatLogprobs | None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: Any
    outputs: list[CompletionOutput]
    finished: bool


class TokensPrompt(TypedDict):
    prompt_token_ids: list[int]


class RequestOutputKind(Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    output_kind = RequestOutputKind.CUMULATIVE
    #: vLLM's SamplingParams is a msgspec Struct; its fields are listed here as msgspec lists them
    __struct_fields__ = ("n", "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                         "stop_token_ids", "ignore_eos", "logprobs", "detokenize", "skip_special_tokens",
                         "flat_logprobs", "output_kind")

    def __init__(self, n=1, max_tokens=16, min_tokens=0, temperature=1.0, top_p=1.0, top_k=0, seed=None, stop=None,
                 stop_token_ids=None, ignore_eos=False, logprobs=None, detokenize=True, skip_special_tokens=True,
                 flat_logprobs=False):
        self.kwargs = dict(n=n, max_tokens=max_tokens, min_tokens=min_tokens, temperature=temperature, top_p=top_p,
                           top_k=top_k, seed=seed, stop=stop, stop_token_ids=stop_token_ids or [],
                           ignore_eos=ignore_eos, logprobs=logprobs, detokenize=detokenize,
                           skip_special_tokens=skip_special_tokens, flat_logprobs=flat_logprobs)


@dataclass
class EngineArgs:
    model: str = ""
    tokenizer: str | None = None
    skip_tokenizer_init: bool = False
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    distributed_executor_backend: str | None = None
    enable_sleep_mode: bool = False
    load_format: str = "auto"
    dtype: str = "auto"
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False
    max_model_len: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_chunked_prefill: bool | None = None
    enable_prefix_caching: bool | None = None
    disable_log_stats: bool = False
    disable_custom_all_reduce: bool = False
    seed: int | None = 0
    logprobs_mode: str = "raw_logprobs"
    max_logprobs: int = 20
    sleep_mode_offload_cudagraph: bool = False
    worker_extension_cls: str = ""


class FakeQwen2(nn.Module):
    """vLLM's model of a checkpoint: fused parameters, and a load_weights that fills them from HF names and reports
    the vLLM names it loaded (names it does not know are skipped without a word, as vLLM's loaders do)."""

    packed_modules_mapping = PACKED

    def __init__(self, hf_shapes: dict[str, tuple[int, ...]], tied: bool):
        super().__init__()
        self.tied = tied
        shapes, self.shards = vllm_layout(hf_shapes)
        for name, shape in shapes.items():
            *path, leaf = name.split(".")
            owner = self
            for part in path:
                if not hasattr(owner, part):
                    owner.add_module(part, nn.Module())
                owner = getattr(owner, part)
            owner.register_parameter(leaf, nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16), requires_grad=False))

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        weights = list(weights)
        if self.tied and any(n == "lm_head.weight" for n, _ in weights):
            raise ValueError("lm_head.weight given for a model with tie_word_embeddings")
        loaded = set()
        for name, tensor in weights:
            if name in self.shards:
                target, offset, rows = self.shards[name]
                params[target].data[offset:offset + rows].copy_(tensor)
                loaded.add(target)
            elif name in params:
                params[name].data.copy_(tensor)
                loaded.add(name)
        return loaded


def default_steps(tokens: int) -> int:
    """Engine steps a request of this many tokens takes: 1 to 3, so requests overtake each other."""
    return 1 + tokens % 3


KV_CACHE_BYTES = 4096  # the fake engine's KV cache in its sleep-mode pool


@dataclass
class AllocationData:
    """vllm.device_allocator.cumem's record of one mapping of the sleep-mode pool: handle[1] is its size in bytes."""
    handle: tuple
    tag: str
    is_asleep: bool = False


class CuMemAllocator:
    """The sleep-mode pool's bookkeeping as vLLM keeps it (a singleton; pointer_to_data by device pointer)."""
    current: CuMemAllocator | None = None

    def __init__(self):
        self.pointer_to_data: dict[int, AllocationData] = {}

    @staticmethod
    def get_instance() -> CuMemAllocator:
        return CuMemAllocator.current

    def allocate(self, tag: str, size: int) -> None:
        self.pointer_to_data[len(self.pointer_to_data) + 1] = AllocationData((0, size, 0, 0), tag)

    def set_asleep(self, tags, asleep: bool) -> None:
        for data in self.pointer_to_data.values():
            if data.tag in tags:
                data.is_asleep = asleep


@dataclass
class FakeVLLM:
    version: str
    calls: list[tuple] = field(default_factory=list)
    llms: list[Any] = field(default_factory=list)
    abort_samples: dict[int, str] = field(default_factory=dict)
    reset_answer: bool = True
    stays_asleep: bool = False
    undo: Any = None
    #: (prompt ids, sample index, {"max_new_tokens", "stop_token_ids"}) -> (tokens, log-probs, finish reason)
    completion: Any = fake_completion
    #: tokens of a request -> the engine steps it takes
    steps_of: Any = default_steps
    #: seconds each engine step takes
    step_s: float = 0.0
    #: the multi_modal_data of each request that had one, by request id
    multi_modal_data: dict[str, dict] = field(default_factory=dict)
    #: the server: seconds each engine step takes (without blocking its event loop); why the engine fails to start
    server_step_s: float = 0.0
    start_error: str | None = None
    #: a request makes no progress after this many steps (it stays running: a test aborts it mid-way)
    stall_after: int | None = None
    #: the server holds its first engine step until this many requests are in flight (a test counts them)
    hold_until: int | None = None

    def names(self) -> list[str]:
        return [c[0] for c in self.calls]


def _engine_class(state: FakeVLLM, llm) -> type:
    class LLMEngine:
        """add_request / step / abort_request of vLLM's (V1) LLMEngine: a request finishes after
        state.steps_of(len(tokens)) steps (1 + len(tokens) % 3 unless a test says otherwise: requests overtake each
        other). Under FINAL_ONLY a step returns a request once,
        finished, with all its tokens; under DELTA every step returns the tokens generated since the last one (the
        request's tokens spread over its steps), the last output finished. Requests of one prompt running at the
        same time are its samples 0, 1, ... (V1 fans n > 1 out into such requests); state.abort_samples names
        requests, in the order they were added, that the engine aborts itself."""

        def __init__(self, model_executor):
            self.model_executor = model_executor
            self.running: dict[str, dict] = {}
            self.added = 0

        def add_request(self, request_id, prompt, params, **kwargs):
            if not isinstance(request_id, str):
                raise TypeError(f"request_id must be a string, got {type(request_id)}")
            if request_id in self.running:
                raise ValueError(f"request id {request_id} is already running")
            if llm.sleeping:
                raise RuntimeError(f"add_request while {sorted(llm.sleeping)} sleep")
            sp = params.kwargs
            ids = list(prompt["prompt_token_ids"])
            state.calls.append(("add_request", request_id, ids, dict(sp), params.output_kind))
            if "multi_modal_data" in prompt:
                state.multi_modal_data[request_id] = prompt["multi_modal_data"]
            sample = sum(1 for entry in self.running.values() if entry["prompt"] == ids)
            rule = {"max_new_tokens": sp["max_tokens"], "stop_token_ids": sp["stop_token_ids"]}
            tokens, lps, reason = state.completion(ids, sample, rule)
            stop_reason = state.abort_samples.get(self.added)
            if stop_reason is not None:
                tokens, lps, reason = [], [], "abort"
            self.added += 1
            self.running[request_id] = dict(prompt=ids, tokens=tokens, lps=lps, reason=reason, stop_reason=stop_reason,
                                             steps=state.steps_of(len(tokens)), done=0, kind=params.output_kind,
                                             logprobs=sp["logprobs"] is not None, flat=sp["flat_logprobs"])

        def _output(self, request_id, entry, start, end, finished):
            tokens, lps = entry["tokens"][start:end], entry["lps"][start:end]
            logprobs = sampled_logprobs(tokens, lps, entry["flat"]) if entry["logprobs"] else None
            completion = CompletionOutput(0, "", tokens, sum(lps), logprobs, entry["reason"] if finished else None,
                                          entry["stop_reason"] if finished else None)
            return RequestOutput(request_id, None, entry["prompt"], None, [completion], finished)

        def step(self):
            state.calls.append(("step", sorted(self.running)))
            time.sleep(state.step_s)
            outputs = []
            for request_id, entry in list(self.running.items()):
                if state.stall_after is not None and entry["done"] >= state.stall_after:
                    continue
                n, steps = len(entry["tokens"]), entry["steps"]
                entry["done"] += 1
                finished = entry["done"] == steps
                if entry["kind"] is RequestOutputKind.DELTA:
                    start, end = n * (entry["done"] - 1) // steps, n * entry["done"] // steps
                    outputs.append(self._output(request_id, entry, start, end, finished))
                elif finished:
                    outputs.append(self._output(request_id, entry, 0, n, True))
                if finished:
                    del self.running[request_id]
            return outputs

        def has_unfinished_requests(self):
            return bool(self.running)

        def abort_request(self, request_ids, internal=False):
            state.calls.append(("abort_request", list(request_ids)))
            for request_id in request_ids:
                self.running.pop(request_id, None)

    return LLMEngine


def _llm_class(state: FakeVLLM) -> type:
    class LLM:
        def __init__(self, **kwargs):
            EngineArgs(**kwargs)  # unknown keywords raise TypeError, like EngineArgs(**kwargs)
            state.calls.append(("LLM", dict(kwargs), {k: os.environ.get(k) for k in ENV_SEEN}))
            with open(os.path.join(kwargs["model"], "config.json")) as f:
                tied = json.load(f).get("tie_word_embeddings", False)
            self.model = FakeQwen2(checkpoint_shapes(kwargs["model"]), tied)
            runner = SimpleNamespace(model=self.model)
            if Version(state.version).release >= (0, 26):  # seen in 0.26.0: get_model() unwraps CUDA-graph wrappers
                runner = SimpleNamespace(model=("a CUDAGraphWrapper",), get_model=lambda: self.model)
            worker = SimpleNamespace(worker=SimpleNamespace(model_runner=runner))
            self.llm_engine = _engine_class(state, self)(SimpleNamespace(driver_worker=worker))
            self.sleeping: set[str] = set()
            CuMemAllocator.current = CuMemAllocator()  # the weights and the KV cache in the sleep-mode pool
            CuMemAllocator.current.allocate("weights", sum(p.numel() * p.element_size()
                                                           for p in self.model.parameters()))
            CuMemAllocator.current.allocate("kv_cache", KV_CACHE_BYTES)
            state.llms.append(self)

        def generate(self, prompts, sampling_params=None, use_tqdm=True):
            sp = sampling_params.kwargs
            state.calls.append(("generate", [list(p["prompt_token_ids"]) for p in prompts], dict(sp)))
            if self.sleeping:
                raise RuntimeError(f"generate while {sorted(self.sleeping)} sleep")
            results, sample = [], 0
            for i, p in enumerate(prompts):
                completions = []
                for s in range(sp["n"]):
                    rule = {"max_new_tokens": sp["max_tokens"], "stop_token_ids": sp["stop_token_ids"]}
                    tokens, lps, reason = state.completion(p["prompt_token_ids"], s, rule)
                    if sample in state.abort_samples:
                        reason = "abort"
                    logprobs = None
                    if sp["logprobs"] is not None:
                        logprobs = sampled_logprobs(tokens, lps, sp["flat_logprobs"])
                    completions.append(CompletionOutput(s, "", tokens, sum(lps), logprobs, reason,
                                                        state.abort_samples.get(sample)))
                    sample += 1
                # the order of `outputs` is not promised; `index` is
                results.append(RequestOutput(str(i), None, list(p["prompt_token_ids"]), None, completions[::-1], True))
            return results

        def sleep(self, level=1):
            state.calls.append(("sleep", level))
            self.sleeping = {"weights", "kv_cache"}
            CuMemAllocator.current.set_asleep(self.sleeping, True)
            if level == 2:
                for param in self.model.parameters():
                    param.data.fill_(float("nan"))

        def wake_up(self, tags=None):
            tags = ["weights", "kv_cache"] if tags is None else list(tags)
            state.calls.append(("wake_up", tags))
            self.sleeping.difference_update(tags)
            CuMemAllocator.current.set_asleep(tags, False)
            if Version(state.version).release < (0, 27):  # 0.26.0 returns None; 0.33 says whether fully awake
                return None
            return not self.sleeping and not state.stays_asleep

        def reset_prefix_cache(self):
            state.calls.append(("reset_prefix_cache",))
            return state.reset_answer

    return LLM


def install_fake_vllm(version: str, dist_dir: str) -> FakeVLLM:
    state = FakeVLLM(version)
    modules = {
        "vllm": module("vllm", LLM=_llm_class(state), SamplingParams=SamplingParams, EngineArgs=EngineArgs,
                       __version__=version),
        "vllm.inputs": module("vllm.inputs", TokensPrompt=TokensPrompt),
        "vllm.sampling_params": module("vllm.sampling_params", SamplingParams=SamplingParams,
                                       RequestOutputKind=RequestOutputKind),
        "vllm.outputs": module("vllm.outputs", RequestOutput=RequestOutput, CompletionOutput=CompletionOutput),
        "vllm.logprobs": module("vllm.logprobs", Logprob=Logprob, FlatLogprobs=FlatLogprobs),
        # the OpenAI-compatible server (fake_vllm_server.py)
        "vllm.entrypoints": module("vllm.entrypoints"),
        "vllm.entrypoints.openai": module("vllm.entrypoints.openai"),
        "vllm.entrypoints.openai.api_server": module("vllm.entrypoints.openai.api_server",
                                                     run_server=make_run_server(state)),
        "vllm.entrypoints.openai.cli_args": module("vllm.entrypoints.openai.cli_args", make_arg_parser=make_arg_parser,
                                                   validate_parsed_serve_args=validate_parsed_serve_args),
        "vllm.device_allocator": module("vllm.device_allocator"),
        "vllm.device_allocator.cumem": module("vllm.device_allocator.cumem", CuMemAllocator=CuMemAllocator),
        "vllm.utils": module("vllm.utils"),
        "vllm.utils.argparse_utils": module("vllm.utils.argparse_utils", FlexibleArgumentParser=FlexibleArgumentParser),
    }
    assert dataclasses.is_dataclass(EngineArgs)
    state.undo = install("vllm", version, modules, dist_dir)
    return state
