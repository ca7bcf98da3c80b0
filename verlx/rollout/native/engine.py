"""`rollout.name=native`: the engine object the worker talks to (residency and a request stream, rollout/base.py).

Knobs come from RolloutConfig (dtype, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens,
max_model_len, enforce_eager, load_format, seed, sleep_level) and engine_kwargs.native (NativeOptions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from verlx.rollout.base import RolloutContext, RolloutEngine, SamplingParams
from verlx.rollout.capabilities import alternatives
from verlx.rollout.native.architectures import model_spec
from verlx.rollout.native.decode_ops import DECODE_BACKENDS, check_backend, select_backend
from verlx.rollout.native.graphs import DecodeRunner
from verlx.rollout.native.kv_cache import KVCache, plan_cache
from verlx.rollout.native.model import NativeModel
from verlx.rollout.native.rope import rope_tables
from verlx.rollout.native.sampling import SAMPLERS, build_sampler, plan_from_params
from verlx.rollout.native.scheduler import SchedulerConfig
from verlx.rollout.native.slots import SlotState
from verlx.rollout.native.stream import NativeStream
from verlx.rollout.native.weights import WeightStore, iter_checkpoint
from verlx.rollout.residency import WEIGHTS
from verlx.utils.registry import did_you_mean


@dataclass
class NativeOptions:
    """actor_rollout_ref.rollout.engine_kwargs.native."""

    # KV cache budget in tokens (overrides gpu_memory_utilization; the only budget besides max_num_seqs on CPU)
    kv_cache_tokens: int | None = None
    # decode steps between host checks for finished rows when rows can stop on a stop token
    sync_interval: int = 16
    # refill freed slots once this fraction of all slots is free (or every waiting row fits)
    refill_fraction: float = 0.125
    # granularity of the KV length buckets the torch decode backend attends over (and of its CUDA graphs)
    kv_len_block: int = 128
    # decode attention/RoPE/SwiGLU: auto (triton on CUDA bf16/fp16 if it passes a self-test, else torch),
    # torch or triton
    decode_backend: str = "auto"
    # token sampling: auto (fused triton kernels on CUDA if they pass a self-test, else torch), torch or triton;
    # both draw the same tokens from the same seeds (to float rounding)
    sampler: str = "auto"

    @classmethod
    def from_dict(cls, raw: dict | None) -> NativeOptions:
        raw = dict(raw or {})
        names = [f.name for f in dataclasses.fields(cls)]
        for key in raw:
            if key not in names:
                raise ValueError(
                    f"unknown key 'actor_rollout_ref.rollout.engine_kwargs.native.{key}'."
                    + did_you_mean(key, names) + f" Known keys: {', '.join(names)}"
                )
        opts = cls(**raw)
        if opts.kv_cache_tokens is not None and opts.kv_cache_tokens < 1:
            raise ValueError(f"engine_kwargs.native.kv_cache_tokens must be >= 1, got {opts.kv_cache_tokens}")
        if opts.sync_interval < 1:
            raise ValueError(f"engine_kwargs.native.sync_interval must be >= 1, got {opts.sync_interval}")
        if not 0.0 < opts.refill_fraction <= 1.0:
            raise ValueError(f"engine_kwargs.native.refill_fraction must be in (0, 1], got {opts.refill_fraction}")
        if opts.kv_len_block < 1:
            raise ValueError(f"engine_kwargs.native.kv_len_block must be >= 1, got {opts.kv_len_block}")
        if opts.sampler != "auto":
            SAMPLERS.get(opts.sampler)
        return opts


class NativeEngine(RolloutEngine):
    """Pure-torch generation for HF Qwen2/Qwen3/Llama/Mistral checkpoints; see docs/rollout.md."""

    name = "native"
    supports_partial_rollout = True
    supports_tensor_parallel = False

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        cfg = self.config
        if ctx.tp_size > 1:
            raise NotImplementedError(
                f"the native rollout engine does not do tensor parallelism (tensor_model_parallel_size="
                f"{ctx.tp_size}); set actor_rollout_ref.rollout.tensor_model_parallel_size=1 (each GPU then "
                f"generates its own data-parallel shard) or use {alternatives('supports_tensor_parallel')}"
            )
        if cfg.load_format not in ("dummy", "auto"):
            raise ValueError(
                f"rollout.load_format={cfg.load_format!r} not supported by the native engine; use dummy or auto"
            )
        self.options = NativeOptions.from_dict(cfg.engine_kwargs.native)
        self.device = torch.device(ctx.device)
        self.dtype = ctx.engine_dtype
        self.spec = model_spec(ctx.hf_config)
        self.weights = WeightStore(self.spec, self.dtype, self.device)
        self.weights.allocate()
        self._load_initial_weights()
        self.cache_plan = plan_cache(
            self.spec, self.dtype, self.device,
            max_len=self.max_model_len,
            max_num_seqs=int(cfg.max_num_seqs),
            kv_cache_tokens=self.options.kv_cache_tokens,
            gpu_memory_utilization=float(cfg.gpu_memory_utilization),
            weight_bytes=self.weights.nbytes,
            prefill_tokens=int(cfg.max_num_batched_tokens),
        )
        cos, sin = rope_tables(ctx.hf_config, self.spec.head_dim, self.cache_plan.max_len, self.dtype, self.device)
        backend = select_backend(self.options.decode_backend, self.device, self.dtype)
        self.model = NativeModel(self.spec, self.weights, cos, sin, backend)
        self.runner = DecodeRunner(self._decode_step, self.device, use_graphs=not cfg.enforce_eager)
        self.sampler = build_sampler(self.options.sampler, self.device, self.spec.vocab_size)
        self.cache: KVCache | None = None
        self.state: SlotState | None = None
        self._wake_kv_cache()
        if not check_backend(self.model, backend, self.cache):
            if self.options.decode_backend != "auto":
                raise RuntimeError(f"engine_kwargs.native.decode_backend={backend} failed its self-test on this "
                                   "device (see the warning above); use decode_backend=torch")
            backend = "torch"
            self.model.decode_ops = DECODE_BACKENDS.get(backend)(self.model)
        self.decode_backend = backend

    # ------------------------------------------------------------------ weights
    def _load_initial_weights(self) -> None:
        if self.config.load_format == "dummy":
            self.weights.init_random(int(self.config.seed))
            return
        copied = set(self.weights.copy_named(iter_checkpoint(self.ctx.model_path)))
        missing = sorted(self.weights.expected_hf_names() - copied)
        if missing:
            raise ValueError(
                f"checkpoint {self.ctx.model_path} lacks {len(missing)} weights the engine needs, e.g. "
                f"{', '.join(missing[:5])}"
            )

    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        with torch.no_grad():
            copied = self.weights.copy_named(named_tensors)
        return self.weights.expected_hf_names() - set(copied)

    # ------------------------------------------------------------------ memory lifecycle
    def memory_bytes(self) -> int:
        """Bytes the engine holds on its device right now (weights + KV cache + slot state)."""
        total = self.weights.nbytes if self.weights.is_allocated else 0
        if self.cache is not None:
            total += self.cache.nbytes + self.state.nbytes
        return total

    def _release(self) -> None:
        self.runner.reset()
        self.cache, self.state = None, None
        self.weights.sleep(keep_host_copy=self.residency.weights_survive_release)
        if self.device.type == "cuda":
            # cuBLAS keeps a workspace per stream (graph capture uses its own); release them with the cache
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()

    def _resume(self, tag: str) -> None:
        self.runner.reset()  # a re-allocation moves buffers the graphs point at
        if tag == WEIGHTS:
            self.weights.wake()
        else:
            self._wake_kv_cache()

    def _wake_kv_cache(self) -> None:
        if self.cache is not None:
            return
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if self.cache_plan.nbytes > free:
                raise RuntimeError(
                    f"native engine: the KV cache needs {self.cache_plan.nbytes / 2**30:.2f} GiB "
                    f"({self.cache_plan.slots} slots × {self.max_model_len} tokens) but only {free / 2**30:.2f} GiB is "
                    "free on the GPU; offload the trainer's parameters/optimizer before waking the cache, or lower "
                    "rollout.gpu_memory_utilization / max_num_seqs"
                )
        self.cache = KVCache(self.spec, self.cache_plan, self.dtype, self.device)
        self.state = SlotState(
            self.cache_plan.slots, int(self.config.response_length), self.ctx.pad_token_id, self.device, self.sampler
        )

    # ------------------------------------------------------------------ generation
    def _decode_step(self, batch: int, kv_len: int, plan) -> None:
        self.state.step(self.model, self.cache, batch, kv_len, plan)

    def _scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=int(self.config.max_num_batched_tokens),
            sync_interval=self.options.sync_interval,
            refill_fraction=self.options.refill_fraction,
            kv_len_block=self.options.kv_len_block,
            weight_bytes_per_step=self._weight_bytes_per_step(),
        )

    def _open_stream(self, params: SamplingParams, partial: bool) -> NativeStream:
        """A cancelled request always comes back with its tokens (`partial` changes nothing)."""
        plan = plan_from_params(dataclasses.replace(params, n=1, max_new_tokens=int(self.config.response_length)))
        return NativeStream(self.model, self.cache, self.state, self.runner, self._scheduler_config(), plan,
                            self.spec.vocab_size, params, self.stream_limits())

    def _weight_bytes_per_step(self) -> int:
        embed = self.spec.vocab_size * self.spec.hidden_size * self.weights.flat.element_size()
        return self.weights.nbytes - (0 if self.spec.tie_word_embeddings else embed)
