"""The rollout-engine interface, its registry and the batch layout every generation returns.

An engine lives inside a worker process next to the FSDP actor. Per step it is woken, given fresh weights, asked to
generate, and put back to sleep so training gets the memory (`RolloutEngine.awake`). An engine is residency plus a
request stream (rollout/stream.py); batch generation, partial rollout and the agent loop are written once over the
stream, so every engine returns the same layout (`build_rollout_batch`) and the trainer never knows which one ran.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import importlib.util
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import torch

from verlx.protocol import DataProto
from verlx.rollout.residency import KV_CACHE, WAKE_ORDER, WEIGHTS, EngineResidency
from verlx.rollout.seeds import row_seed
from verlx.rollout.stream import RequestStream, StreamLimits
from verlx.utils.registry import Registry
from verlx.utils.timer import timed

logger = logging.getLogger(__name__)
T = TypeVar("T")
ROLLOUT_ENGINES: Registry[type[RolloutEngine]] = Registry("rollout engine", "actor_rollout_ref.rollout.name",
                                                            import_paths=True)
# Built-in engines by name; each module is imported when its engine is first asked for (and imports its own
# package lazily in turn), so nothing here imports an engine.
for _name, _target in {
    "native": "verlx.rollout.native.engine:NativeEngine",
    "hf": "verlx.rollout.hf_engine:HFEngine",
    "sglang": "verlx.rollout.sglang_engine:SGLangRolloutEngine",
    "vllm": "verlx.rollout.vllm_engine:VLLMRolloutEngine",
}.items():
    ROLLOUT_ENGINES.register_lazy(_name, _target)
# `auto` tries these in order and takes the first whose package is installed.
AUTO_ENGINE_ORDER = ("sglang", "vllm", "native")


@dataclass
class RolloutContext:
    """Everything an engine needs to know about where it runs."""

    config: Any  # RolloutConfig
    model_path: str
    hf_config: Any
    device: torch.device
    pad_token_id: int
    eos_token_ids: list[int]
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    tp_size: int = 1
    trust_remote_code: bool = False
    tokenizer_path: str | None = None
    #: worker processes (GPUs) per node, trainer.n_gpus_per_node; None: every rank on one node
    n_gpus_per_node: int | None = None
    #: shares its devices with training (false: a rollout worker group of its own, whose engines stay awake)
    colocated: bool = True

    @property
    def gpus_per_node(self) -> int:
        return self.n_gpus_per_node or self.world_size

    @property
    def nnodes(self) -> int:
        return self.world_size // self.gpus_per_node

    @property
    def engine_dtype(self) -> torch.dtype:
        """rollout.dtype on GPU; float32 on CPU (weight_sync.engine_dtype_on)."""
        from verlx.rollout.weight_sync import engine_dtype_on

        return engine_dtype_on(self.config.dtype, self.device)

    @functools.cached_property
    def layout(self):
        """Tensor-parallel groups, GPUs and ports of this rank (verlx.rollout.engine_layout): the one place the
        rollout rank arithmetic is done."""
        from verlx.rollout.engine_layout import DEFAULT_BASE_PORT, plan_engine_layout

        base_port = int(os.environ.get("VERLX_ROLLOUT_BASE_PORT", DEFAULT_BASE_PORT))
        return plan_engine_layout(self.rank, self.world_size, self.tp_size, self.gpus_per_node, self.nnodes, base_port)

    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank

    @property
    def dp_size(self) -> int:
        return self.layout.dp_size


@dataclass
class SamplingParams:
    """Engine-neutral sampling settings for one generate call."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 512
    min_new_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def resolve_sampling(config, meta_info: dict, eos_token_ids: list[int]) -> SamplingParams:
    """Config + per-call meta_info → SamplingParams.

    meta_info keys: validate (use val_kwargs), do_sample (false = greedy), and explicit overrides
    temperature / top_p / top_k / n / max_new_tokens / min_new_tokens / ignore_eos / seed.
    """
    if meta_info.get("validate", False):
        v = config.val_kwargs
        base = dict(n=v.n, temperature=v.temperature if v.do_sample else 0.0, top_p=v.top_p, top_k=v.top_k)
    else:
        do_sample = meta_info.get("do_sample", config.do_sample)
        base = dict(n=1, temperature=config.temperature if do_sample else 0.0, top_p=config.top_p, top_k=config.top_k)
    for key in ("temperature", "top_p", "top_k", "n"):
        if key in meta_info:
            base[key] = meta_info[key]
    if not meta_info.get("do_sample", True):
        base["temperature"] = 0.0
    params = SamplingParams(
        **base,
        max_new_tokens=int(meta_info.get("max_new_tokens", config.response_length)),
        min_new_tokens=int(meta_info.get("min_new_tokens", 0)),
        ignore_eos=bool(meta_info.get("ignore_eos", config.ignore_eos)),
        stop_token_ids=list(eos_token_ids),
        seed=meta_info.get("seed"),
    )
    if params.n < 1:
        raise ValueError(f"rollout n must be >= 1, got {params.n} (actor_rollout_ref.rollout.n / val_kwargs.n)")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.greedy:
        params.top_p, params.top_k = 1.0, -1
    return params


@dataclass(frozen=True)
class PolicyWeights:
    """A version of the trainer's weights and how to stream them into an engine (HF names, full tensors): `open()`
    is a context manager that yields the lazy stream (the actor's parameters are on the device inside it)."""

    version: int
    open: Callable[[], AbstractContextManager[Iterable[tuple[str, torch.Tensor]]]]


class RolloutEngine(abc.ABC):
    """Generation inside a worker: residency (sleep / wake_up / update_weights) and a request stream (open_stream).

    The public methods keep `residency`, the one record of what the engine holds, and call the engine's hooks
    (`_release`, `_resume`, `_load_weights`, `_open_stream`) only when the state allows; `generate` (batch and
    partial rollout) and the agent loop are written once over the stream. What an engine can do is declared below.
    """

    #: the name in messages
    name: ClassVar[str] = "custom"
    #: the pip package whose presence makes the engine usable (None: always available)
    requires_package: ClassVar[str | None] = None
    #: decodes greedily (REMAX's baseline needs it)
    supports_greedy: ClassVar[bool] = True
    #: a cancelled request returns the tokens it generated, and a request may continue a response from them
    #: with new weights (trainer.partial_rollout)
    supports_partial_rollout: ClassVar[bool] = False
    #: can serve its requests from an HTTP server of its own (actor_rollout_ref.rollout.server.enable)
    supports_server: ClassVar[bool] = False
    #: shards one replica over several GPUs (rollout.tensor_model_parallel_size > 1)
    supports_tensor_parallel: ClassVar[bool] = True
    #: tensor-parallel peers each drive their share and must submit the same requests in the same order (vLLM's
    #: SPMD mode): requests whose order depends on timing (tool calls, interruptions) need tensor parallel size 1
    tensor_parallel_in_lockstep: ClassVar[bool] = False
    #: loads vision-language models and generates from prompts with images (a request's vision inputs)
    supports_image_input: ClassVar[bool] = False
    #: takes image inputs in server mode too (rollout.server.enable): its server's generate request carries images
    supports_server_image_input: ClassVar[bool] = False
    #: refuses to start with a context longer than the model's max_position_embeddings unless this environment
    #: variable is set (None: positions beyond it are generated as RoPE gives them)
    context_limit_override_env: ClassVar[str | None] = None
    #: tokens the engine's context needs beyond the longest sequence (prompt + response)
    context_length_margin: ClassVar[int] = 0

    @classmethod
    def checkpoint_problems(cls, config: dict) -> list[str]:
        """What in a model's parsed config.json this engine cannot load, each a phrase (checked before Ray)."""
        return []

    def __init__(self, ctx: RolloutContext):
        self.ctx = ctx
        self.config = ctx.config
        cfg = self.config
        self.max_model_len = int(cfg.max_model_len or cfg.prompt_length + cfg.response_length)
        #: releases its memory between generations: it shares its devices with training and free_cache_engine
        self.sleeps = bool(cfg.free_cache_engine) and ctx.colocated
        self.residency = EngineResidency(self.name, weights_current=not cfg.load_format.startswith("dummy"),
                                         weights_survive_release=int(cfg.sleep_level) < 2)
        self.generations = 0
        #: what the last batch generation reported (rounds, prefill and decode time...; engine-specific)
        self.last_stats: dict | None = None

    @classmethod
    def is_available(cls) -> bool:
        return cls.requires_package is None or importlib.util.find_spec(cls.requires_package) is not None

    @classmethod
    def check_install(cls) -> None:
        """Raise if the installed package cannot be used (e.g. an unsupported release); runs before Ray starts."""

    @classmethod
    def install_command(cls) -> str:
        """What to tell a user who chose the engine without its package installed."""
        return f"pip install {cls.requires_package}" if cls.requires_package else ""

    def shutdown(self) -> None:
        """Stop what the engine started outside this process (an engine's HTTP server) before the worker goes;
        nothing for an engine without such."""

    def unbacked_allocated_bytes(self) -> int:
        """Bytes this process's torch allocator counts as allocated that hold no device memory now: an engine whose
        sleep unmaps memory under tensors it keeps (vLLM's sleep-mode pool) says how much, so that the training
        phases' peaks (perf/max_memory_allocated_gb/<phase>) leave it out; 0 for the others."""
        return 0

    # ------------------------------------------------------------------ residency
    def sleep(self) -> None:
        """Release weights and KV cache (the training phase needs the memory); nothing for an engine that keeps
        them (rollout.free_cache_engine=false, or a rollout worker group of its own)."""
        if self.sleeps and not self.residency.asleep:
            self._release()
            self.residency.mark_released()

    def wake_up(self, tags: Iterable[str] = WAKE_ORDER) -> None:
        """Restore what sleep released, in wake order: `weights` before a weight push, `kv_cache` after it."""
        for tag in self.residency.to_resume(tags):
            self._resume(tag)
            self.residency.mark_resumed([tag])

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """One push of a weight version: copy the HF-named tensors of a (lazy) stream into the engine, bucket by
        bucket; raise if the engine rejects them. Completeness is counted within this one call (an engine with
        random or discarded weights may generate only after a push of every parameter), so callers pass the
        whole stream at once, never one bucket per call."""
        self.residency.require_weights_resident()
        unset = self._load_weights(named_tensors)
        if unset and not self.residency.weights_current:
            logger.warning("%s: the push left %d parameters unset (%s...); generate stays refused until a complete "
                           "push", self.name, len(unset), sorted(unset)[:4])
        self.residency.mark_pushed(complete=not unset, version=version)

    @contextlib.contextmanager
    def awake(self, weights: PolicyWeights | None = None) -> Iterator[dict[str, float]]:
        """The engine's cycle around one generation, in one place: weights resumed, `weights` pushed unless the
        engine holds that version already, the KV cache resumed; released again after the block. Yields the
        timings it measured, each part of the cycle apart (timing_s/wake_weights, update_weights when it pushed,
        wake_kv_cache, and engine_sleep, added to the same dict once the block has run)."""
        timing: dict[str, float] = {}
        with timed("timing_s/wake_weights", timing):
            self.wake_up([WEIGHTS])
        if weights is not None and not self.residency.holds(weights.version):
            with timed("timing_s/update_weights", timing), weights.open() as tensors:
                self.update_weights(tensors, version=weights.version)
        with timed("timing_s/wake_kv_cache", timing):
            if self.ctx.device.type == "cuda" and KV_CACHE not in self.residency.resident:
                torch.cuda.empty_cache()  # cached free blocks are invisible to an engine that asks the driver
            self.wake_up([KV_CACHE])
        yield timing
        with timed("timing_s/engine_sleep", timing):
            self.sleep()

    # ------------------------------------------------------------------ generation
    def open_stream(self, params: SamplingParams, partial: bool = False) -> RequestStream:
        """A request stream with the sampling settings of `params` (each request brings its own budget); its
        `base_seed` is the seed this generation's rows derive theirs from. `partial`: a cancelled request must
        come back with the tokens it generated (partial rollout; engines for which that costs something, vLLM,
        track them only when asked)."""
        self.residency.require_ready_to_generate()
        self.generations += 1
        stream = self._open_stream(params, partial)
        stream.base_seed = (int(params.seed) if params.seed is not None
                            else row_seed(int(self.config.seed) + self.ctx.dp_rank, self.generations))
        return stream

    def stream_limits(self) -> StreamLimits:
        return StreamLimits(int(self.config.response_length), self.max_model_len)

    def generate(self, prompts: DataProto, interrupted: Callable[[], bool] | None = None) -> DataProto:
        """Left-padded prompts (input_ids, attention_mask, position_ids) → the rollout batch layout. With
        `interrupted`, a partial rollout: rows may continue earlier responses and stop when it turns true
        (rollout/generation.py)."""
        from verlx.rollout.generation import generate_batch

        return self.drive(lambda: generate_batch(self, prompts, interrupted))

    def drive(self, generation: Callable[[], T]) -> T:
        """Run a whole generation (batch, partial or agent loop) where this engine's requests are made, and return
        its result on every rank. Here by default; SGLang's tensor-parallel groups run it on their leader."""
        return generation()

    # ------------------------------------------------------------------ what an engine implements
    @abc.abstractmethod
    def _release(self) -> None:
        """Release weights and KV cache on the device."""

    @abc.abstractmethod
    def _resume(self, tag: str) -> None:
        """Restore one released tag (WEIGHTS or KV_CACHE)."""

    @abc.abstractmethod
    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Copy the tensors in; return the names of the parameters this push left unset (empty: complete)."""

    @abc.abstractmethod
    def _open_stream(self, params: SamplingParams, partial: bool) -> RequestStream:
        """The engine's RequestStream for one generation."""


def resolve_engine_name(name: str, required: tuple[str, ...] = ()) -> str:
    """`auto` → the first installed of AUTO_ENGINE_ORDER that declares the `required` capabilities (hf when none
    does); `module:Class` → a user engine; any other name must be registered and installed."""
    if name == "auto":
        for candidate in AUTO_ENGINE_ORDER:
            engine = ROLLOUT_ENGINES.get(candidate)
            if not all(getattr(engine, capability) for capability in required):
                continue
            if engine.is_available():
                try:
                    engine.check_install()
                except Exception as e:  # an installed but unusable engine: try the next one
                    logger.warning("rollout.name=auto skips %s: %s", candidate, e)
                    continue
                return candidate
        return "hf"
    cls = ROLLOUT_ENGINES.get(name)
    if not (isinstance(cls, type) and issubclass(cls, RolloutEngine)):
        raise TypeError(f"actor_rollout_ref.rollout.name={name} is not a RolloutEngine subclass")
    if not cls.is_available():
        raise RuntimeError(
            f"actor_rollout_ref.rollout.name={name} needs the '{cls.requires_package}' package, which is not "
            f"installed. Install it with: {cls.install_command()}. Or choose rollout.name=native, which needs "
            "nothing beyond torch."
        )
    cls.check_install()
    return name


def get_engine_class(name: str) -> type[RolloutEngine]:
    return ROLLOUT_ENGINES.get(resolve_engine_name(name))


# ---------------------------------------------------------------------- the shared output layout
def build_rollout_batch(
    prompts: DataProto,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor | None,
    n: int,
) -> DataProto:
    """The layout every engine returns, rows ordered [p0s0, p0s1, ..., p1s0, ...] (prompts repeated n times).

    responses: [B*n, R] padded on the right with the pad token; response_mask: 1 for generated tokens up to and
    including the stop token. input_ids/attention_mask/position_ids cover prompt + response (position_ids [B, 4, T]
    for a vision-language prompt: the response continues every axis from the prompt's last token, as text does).
    """
    source = prompts.repeat(n, interleave=True) if n > 1 else prompts
    prompt_ids = source.batch["input_ids"]
    prompt_mask = source.batch["attention_mask"]
    prompt_pos = source.batch["position_ids"]
    if responses.shape[0] != prompt_ids.shape[0]:
        raise ValueError(f"engine returned {responses.shape[0]} responses for {prompt_ids.shape[0]} prompt samples")
    response_mask = response_mask.to(prompt_mask.dtype)
    r = responses.shape[1]
    delta = torch.arange(1, r + 1, device=prompt_pos.device, dtype=prompt_pos.dtype)
    response_pos = prompt_pos[..., -1:] + delta  # [B, R], or [B, 4, R]: a response is text on every axis
    batch = {
        "prompts": prompt_ids,
        "responses": responses.to(prompt_ids.dtype),
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses.to(prompt_ids.dtype)], dim=-1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=-1),
    }
    if rollout_log_probs is not None:
        batch["rollout_log_probs"] = rollout_log_probs.float() * response_mask
    non_tensor = {k: v for k, v in source.non_tensor_batch.items()}
    return DataProto(batch, non_tensor, dict(prompts.meta_info))


def mask_after_stop(tokens: torch.Tensor, stop_token_ids: list[int],
                    pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Given generated tokens [B, R], keep everything up to and including the first stop token.

    Returns (tokens with pad after the stop, response_mask), computed without a Python loop over tokens.
    """
    if stop_token_ids:
        is_stop = torch.isin(tokens, torch.tensor(stop_token_ids, device=tokens.device))
        # a position is valid if no stop token occurred strictly before it
        stops_before = torch.cumsum(is_stop.int(), dim=-1) - is_stop.int()
        mask = stops_before == 0
    else:
        mask = torch.ones_like(tokens, dtype=torch.bool)
    return torch.where(mask, tokens, torch.full_like(tokens, pad_token_id)), mask.long()
