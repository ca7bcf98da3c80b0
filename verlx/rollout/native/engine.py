"""`rollout.name=native`: the engine object the worker talks to (generate / sleep / wake_up / update_weights).

Knobs come from RolloutConfig (dtype, gpu_memory_utilization, max_num_seqs, max_num_batched_tokens,
max_model_len, enforce_eager, load_format, seed, sleep_level) and engine_kwargs.native (NativeOptions).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from verlx.protocol import DataProto
from verlx.rollout.base import RolloutContext, RolloutEngine, build_rollout_batch, resolve_sampling
from verlx.rollout.native.architectures import model_spec
from verlx.rollout.native.decode_ops import DECODE_BACKENDS, check_backend, select_backend
from verlx.rollout.native.graphs import DecodeRunner
from verlx.rollout.native.kv_cache import KVCache, plan_cache
from verlx.rollout.native.model import NativeModel
from verlx.rollout.native.rope import rope_tables
from verlx.rollout.native.sampling import SAMPLERS, build_sampler, plan_from_params, row_seed
from verlx.rollout.native.scheduler import Scheduler, SchedulerConfig
from verlx.rollout.native.slots import SlotState
from verlx.rollout.native.stream import RequestStream
from verlx.rollout.native.weights import WeightStore, iter_checkpoint
from verlx.utils.registry import did_you_mean

WAKE_TAGS = ("weights", "kv_cache")


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

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        cfg = self.config
        if ctx.tp_size > 1:
            raise NotImplementedError(
                f"the native rollout engine does not do tensor parallelism (tensor_model_parallel_size="
                f"{ctx.tp_size}); set actor_rollout_ref.rollout.tensor_model_parallel_size=1 (each GPU then "
                "generates its own data-parallel shard) or use rollout.name=sglang/vllm"
            )
        if cfg.load_format not in ("dummy", "auto"):
            raise ValueError(
                f"rollout.load_format={cfg.load_format!r} not supported by the native engine; use dummy or auto"
            )
        self.options = NativeOptions.from_dict(cfg.engine_kwargs.native)
        self.device = torch.device(ctx.device)
        self.dtype = ctx.engine_dtype
        self.spec = model_spec(ctx.hf_config)
        self.max_len = int(cfg.max_model_len or cfg.prompt_length + cfg.response_length)
        self.weights = WeightStore(self.spec, self.dtype, self.device)
        self.weights.allocate()
        self._load_initial_weights()
        self.cache_plan = plan_cache(
            self.spec, self.dtype, self.device,
            max_len=self.max_len,
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
        self._weights_valid = True
        self._pushed: set[str] = set()
        self._calls = 0
        self.last_stats: dict | None = None
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

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        with torch.no_grad():
            copied = self.weights.copy_named(named_tensors)
        if not self._weights_valid:
            self._pushed.update(copied)
            self._weights_valid = self._pushed >= self.weights.expected_hf_names()

    # ------------------------------------------------------------------ memory lifecycle
    def memory_bytes(self) -> int:
        """Bytes the engine holds on its device right now (weights + KV cache + slot state)."""
        total = self.weights.nbytes if self.weights.is_allocated else 0
        if self.cache is not None:
            total += self.cache.nbytes + self.state.nbytes
        return total

    def sleep(self) -> None:
        self.runner.reset()
        self.cache, self.state = None, None
        self.weights.sleep(keep_host_copy=int(self.config.sleep_level) < 2)
        if self.device.type == "cuda":
            # cuBLAS keeps a workspace per stream (graph capture uses its own); release them with the cache
            clear_workspaces = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
            if clear_workspaces is not None:
                clear_workspaces()
            torch.cuda.empty_cache()

    def wake_up(self, tags: Iterable[str] = WAKE_TAGS) -> None:
        tags = list(tags)
        unknown = [t for t in tags if t not in WAKE_TAGS]
        if unknown:
            raise ValueError(f"wake_up got unknown tags {unknown}; use a subset of {list(WAKE_TAGS)}")
        if "weights" in tags and not self.weights.is_allocated:
            self.runner.reset()  # a re-allocation moves buffers the graphs point at
            self._weights_valid = self.weights.wake()
            self._pushed = set()
        if "kv_cache" in tags and self.cache is None:
            self.runner.reset()
            self._wake_kv_cache()

    def _wake_kv_cache(self) -> None:
        if self.cache is not None:
            return
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            if self.cache_plan.nbytes > free:
                raise RuntimeError(
                    f"native engine: the KV cache needs {self.cache_plan.nbytes / 2**30:.2f} GiB "
                    f"({self.cache_plan.slots} slots × {self.max_len} tokens) but only {free / 2**30:.2f} GiB is "
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

    def generate(self, prompts: DataProto) -> DataProto:
        params = resolve_sampling(self.config, prompts.meta_info, self.ctx.eos_token_ids)
        self._require_ready()
        plan = plan_from_params(params)
        response_len = int(self.config.response_length)
        if plan.max_new_tokens > response_len:
            raise ValueError(
                f"max_new_tokens={plan.max_new_tokens} exceeds rollout.response_length={response_len}, the width "
                "of the returned responses; raise response_length or lower max_new_tokens"
            )
        input_ids = prompts.batch["input_ids"].to(self.device)
        lens = self._validate_prompts(input_ids, prompts.batch["attention_mask"].to(self.device), plan.max_new_tokens)
        seeds = self._row_seeds(prompts, params.n, params.seed)
        self._calls += 1
        scheduler = Scheduler(self.model, self.cache, self.state, self.runner, self._scheduler_config())
        with torch.no_grad():
            tokens, logprobs, lengths, stats = scheduler.generate(input_ids, lens, params.n, plan, seeds)
        self.last_stats = stats.as_dict()
        out = prompts.batch["input_ids"].device
        mask = torch.arange(response_len, device=lengths.device)[None, :] < lengths[:, None]
        log_probs = logprobs.to(out) if self.config.calculate_log_probs else None
        return build_rollout_batch(prompts, tokens.to(out), mask.to(out), log_probs, params.n)

    def _scheduler_config(self) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=int(self.config.max_num_batched_tokens),
            sync_interval=self.options.sync_interval,
            refill_fraction=self.options.refill_fraction,
            kv_len_block=self.options.kv_len_block,
            weight_bytes_per_step=self._weight_bytes_per_step(),
        )

    def open_stream(self, params) -> tuple[RequestStream, int]:
        """A RequestStream for requests that arrive one by one (multi-turn rollouts), with the sampling settings
        of `params` (each request brings its own max_new_tokens), and the base seed of this call's requests."""
        self._require_ready()
        plan = plan_from_params(dataclasses.replace(params, n=1, max_new_tokens=int(self.config.response_length)))
        self._calls += 1
        base = int(params.seed) if params.seed is not None else row_seed(int(self.config.seed) + self.ctx.dp_rank,
                                                                          self._calls)
        stream = RequestStream(self.model, self.cache, self.state, self.runner, self._scheduler_config(), plan,
                               self.spec.vocab_size)
        return stream, base

    def _require_ready(self) -> None:
        if not self.weights.is_allocated or self.cache is None:
            raise RuntimeError("native engine is asleep; call wake_up(['weights', 'kv_cache']) before generate")
        if not self._weights_valid:
            missing = sorted(self.weights.expected_hf_names() - self._pushed)
            raise RuntimeError(
                f"native engine weights were discarded by sleep (sleep_level={self.config.sleep_level}) and "
                f"{len(missing)} were not pushed since wake_up, e.g. {', '.join(missing[:5])}; push the full "
                "state dict with update_weights before generate"
            )

    def _validate_prompts(self, input_ids: torch.Tensor, mask: torch.Tensor, max_new: int) -> list[int]:
        """Real prompt lengths of a left-padded batch; errors name the row. One host sync."""
        mask = mask.long()
        left_padded = (mask[:, 1:] >= mask[:, :-1]).all(-1) if mask.shape[1] > 1 else torch.ones_like(mask[:, 0]).bool()
        real_ids = torch.where(mask.bool(), input_ids, torch.zeros_like(input_ids))
        facts = torch.stack((mask.sum(-1), left_padded.long(), real_ids.max(-1).values, real_ids.min(-1).values)).cpu()
        lens, ok, max_id, min_id = (facts[i].tolist() for i in range(4))
        for row, (n, padded, hi, lo) in enumerate(zip(lens, ok, max_id, min_id)):
            if not padded:
                raise ValueError(f"prompt row {row}: attention_mask is not left-padded (zeros must precede ones)")
            if n < 1:
                raise ValueError(f"prompt row {row} has no tokens (attention_mask is all zeros)")
            if n + max_new > self.max_len:
                raise ValueError(
                    f"prompt row {row} has {n} tokens; with max_new_tokens={max_new} it needs {n + max_new} positions "
                    f"but the engine's max_model_len is {self.max_len}; raise rollout.max_model_len (or "
                    "prompt_length) or truncate the prompt"
                )
            if hi >= self.spec.vocab_size or lo < 0:
                raise ValueError(f"prompt row {row} has token id {hi if hi >= self.spec.vocab_size else lo} "
                                 f"outside the vocabulary [0, {self.spec.vocab_size})")
        return lens

    def _row_seeds(self, prompts: DataProto, n: int, seed: int | None) -> list[int]:
        """Row (prompt i, sample j) -> 32-bit seed: from non_tensor_batch['seed'][i] when given (independent of
        the batch), else from the call's seed (meta_info['seed'], or rollout.seed + dp_rank and a call counter)."""
        per_prompt = prompts.non_tensor_batch.get("seed")
        if seed is None:
            base = row_seed(int(self.config.seed) + self.ctx.dp_rank, self._calls)
        else:
            base = int(seed)
        prompt_seeds = [
            int(per_prompt[i]) if per_prompt is not None else row_seed(base, i) for i in range(len(prompts))
        ]
        return [row_seed(s, j) for s in prompt_seeds for j in range(n)]

    def _weight_bytes_per_step(self) -> int:
        embed = self.spec.vocab_size * self.spec.hidden_size * self.weights.flat.element_size()
        return self.weights.nbytes - (0 if self.spec.tie_word_embeddings else embed)
