"""vLLM's side of the rollout contract, as pure functions: LLM arguments, sampling parameters, reading a request's
output, and the check that model.load_weights took what was sent.

Kept apart from the engine class so every mapping is checked on machines without vLLM. Facts follow the
documented vllm 0.11–0.33 in-process API (docs/rollout.md lists them).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

from verlx.models.vision import renamed_by_prefix, vision_language_model
from verlx.rollout.base import RolloutContext, SamplingParams
from verlx.rollout.engine_layout import EngineLayout
from verlx.rollout.kernel_backends import KernelInventory, vllm_backends
from verlx.rollout.token_io import EngineGenerationError
from verlx.utils.registry import did_you_mean

logger = logging.getLogger(__name__)
ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm"
#: LLM arguments verlx derives from the mesh, the sleep cycle and the log-prob convention.
MANAGED_LLM_ARGS = frozenset(
    {
        "model",
        "tensor_parallel_size",
        "distributed_executor_backend",
        "enable_sleep_mode",
        "skip_tokenizer_init",
        "logprobs_mode",
        "seed",
    }
)
#: log-probs of the distribution actually sampled from: log_softmax(logits / T), what the trainer recomputes
LOGPROBS_MODE = "processed_logprobs"


def _dtype_arg(dtype: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(dtype, dtype)


def build_llm_args(ctx: RolloutContext, layout: EngineLayout, field_names: Iterable[str],
                   kernels: KernelInventory) -> dict[str, Any]:
    """Keyword arguments of vllm.LLM for this rank; user engine_kwargs are checked against EngineArgs' fields.
    An attention backend whose kernels are missing here is replaced (logged) unless engine_kwargs names one.

    seed is the same on every rank of a TP group (rollout.seed + data-parallel rank): vLLM's SPMD mode needs TP
    peers to sample identically, and different replicas to sample differently. A vision-language model keeps its
    tokenizer (vLLM's multimodal processor reads the image token from it, as veRL lets it); prompts still go in as
    ids and come back as ids (detokenize=False).
    """
    cfg = ctx.config
    field_names = frozenset(field_names)
    args: dict[str, Any] = dict(
        model=ctx.model_path,
        tokenizer=ctx.tokenizer_path or ctx.model_path,
        skip_tokenizer_init=vision_language_model(ctx.hf_config) is None,
        trust_remote_code=ctx.trust_remote_code,
        tensor_parallel_size=layout.tp_size,
        distributed_executor_backend="external_launcher",
        enable_sleep_mode=bool(cfg.free_cache_engine),
        load_format="dummy" if cfg.load_format.startswith("dummy") else cfg.load_format,
        dtype=_dtype_arg(cfg.dtype),
        gpu_memory_utilization=cfg.gpu_memory_utilization,
        enforce_eager=cfg.enforce_eager,
        max_model_len=cfg.max_model_len or cfg.prompt_length + cfg.response_length,
        max_num_seqs=cfg.max_num_seqs,
        max_num_batched_tokens=cfg.max_num_batched_tokens,
        enable_chunked_prefill=cfg.enable_chunked_prefill,
        enable_prefix_caching=cfg.enable_prefix_caching,
        disable_log_stats=cfg.disable_log_stats,
        # custom all-reduce keeps IPC buffers outside the sleep-mode pool
        disable_custom_all_reduce=True,
        seed=cfg.seed + layout.dp_rank,
        logprobs_mode=LOGPROBS_MODE,
    )
    user = {k: v for k, v in dict(cfg.engine_kwargs.vllm or {}).items() if v is not None}
    backends = vllm_backends(kernels, user)
    if backends.reasons and "attention_backend" in field_names:
        logger.warning("vllm: choosing %s; set %s.<key> to override", "; ".join(backends.reasons), ENGINE_KWARGS_KEY)
        args.update(backends.args)
    for key in user:
        if key in MANAGED_LLM_ARGS:
            raise ValueError(
                f"{ENGINE_KWARGS_KEY}.{key} is set by verlx (mesh, sleep cycle, log-prob convention); remove it"
            )
        if key not in field_names:
            raise ValueError(
                f"{ENGINE_KWARGS_KEY}.{key} is not an argument of vllm.LLM (EngineArgs) in this release."
                + did_you_mean(key, field_names)
            )
    args.update(user)
    return args


def vllm_sampling_kwargs(params: SamplingParams, want_log_probs: bool, flat_logprobs: bool = False) -> dict[str, Any]:
    """SamplingParams → keyword arguments of vllm.SamplingParams.

    max_tokens is always explicit (vLLM's default is 16). Greedy is temperature 0 (vLLM then ignores top-p/k and
    the seed); top_k <= 0 means all tokens (-1). stop_token_ids are the EOS ids: vLLM's ignore_eos only ignores
    the model's EOS, so they are dropped too. logprobs=0 returns the sampled token's log-prob only; with
    `flat_logprobs` (a release that has it: takes_flat_logprobs) as flat lists rather than a dict and a Logprob
    object per token, which the engine's process would otherwise build and garbage-collect while it generates.
    No per-request seed: vLLM samples seeded requests one at a time with their own generators (slow at RL batch
    sizes) and seeds a prompt's children seed + index, the same noise for every prompt; the engine's seed (per
    replica, identical on tensor-parallel peers) is used instead.
    """
    greedy = params.greedy
    kwargs: dict[str, Any] = dict(
        n=params.n,
        max_tokens=params.max_new_tokens,
        min_tokens=params.min_new_tokens,
        temperature=0.0 if greedy else float(params.temperature),
        top_p=1.0 if greedy else float(params.top_p),
        top_k=-1 if greedy or params.top_k <= 0 else int(params.top_k),
        ignore_eos=params.ignore_eos,
        stop_token_ids=[] if params.ignore_eos else [int(t) for t in params.stop_token_ids],
        detokenize=False,
        logprobs=0 if want_log_probs else None,
    )
    if want_log_probs and flat_logprobs:
        kwargs["flat_logprobs"] = True
    return kwargs


def takes_flat_logprobs(sampling_params_type: type) -> bool:
    """Whether this release's vllm.SamplingParams (a msgspec Struct, its fields in `__struct_fields__`) has
    `flat_logprobs` (vLLM pull request 28914, in releases since December 2025)."""
    return "flat_logprobs" in getattr(sampling_params_type, "__struct_fields__", ())


def completion_tokens(completion, want_log_probs: bool, request: str,
                      flat_logprobs: bool = False) -> tuple[list[int], list[float] | None]:
    """A CompletionOutput's token ids and, when asked for, the log-prob of each sampled token; the ids and log-probs
    it covers are the request's new ones under RequestOutputKind.DELTA, all of them under FINAL_ONLY.

    `logprobs` holds per position a mapping token_id → Logprob(logprob, rank, decoded_token), or, when the request
    asked for flat_logprobs, one FlatLogprobs whose `token_ids` and `logprobs` lists hold one entry per position
    (logprobs=0: the sampled token's)."""
    ids = [int(t) for t in completion.token_ids]
    if not want_log_probs:
        return ids, None
    positions = completion.logprobs
    if positions is None or len(positions) != len(ids):
        got = "none" if positions is None else len(positions)
        raise EngineGenerationError(f"vllm request {request}: {len(ids)} tokens but {got} log-prob entries")
    if flat_logprobs:
        if list(positions.token_ids) != ids:
            raise EngineGenerationError(f"vllm request {request}: the log-probs name tokens "
                                        f"{list(positions.token_ids)[:6]}... but the sampled tokens are {ids[:6]}...")
        return ids, list(positions.logprobs)
    try:
        return ids, [float(pos[t].logprob) for pos, t in zip(positions, ids)]
    except KeyError as e:
        raise EngineGenerationError(f"vllm request {request}: no log-prob for sampled token {e}") from None


def finish_of(completion) -> tuple[str, str]:
    """(finish reason: stop | length | abort, the engine's stop_reason when it aborted)."""
    return str(completion.finish_reason), str(completion.stop_reason or "")


#: vLLM's Qwen2-VL, Qwen2.5-VL and Qwen3-VL classes hold the text model as `language_model` and the image encoder as
#: `visual`; their load_weights maps checkpoint names with the class's hf_to_vllm_mapper (these prefixes, first
#: match, in vllm 0.26.0's models/qwen2_vl.py and qwen2_5_vl.py; qwen3_vl.py has the first three, its checkpoints'
#: names) and reports what it loaded under the mapped names
VISION_LANGUAGE_PREFIXES = (
    ("model.language_model.", "language_model.model."),
    ("model.visual.", "visual."),
    ("lm_head.", "language_model.lm_head."),
    ("model.", "language_model.model."),
)


def vision_language_param_name(name: str) -> str:
    """The vLLM parameter a Qwen2-VL / Qwen2.5-VL / Qwen3-VL checkpoint name loads into (before q/k/v and gate/up
    fusion)."""
    return renamed_by_prefix(name, VISION_LANGUAGE_PREFIXES)


def unloaded_names(sent: list[str], loaded: set[str], packed_modules_mapping: dict[str, list[str]],
                   param_name: Callable[[str], str] | None = None) -> list[str]:
    """Names sent to model.load_weights that it did not load. vLLM reports its own parameter names: `param_name`
    maps a sent name to one (a vision-language model's, vision_language_param_name; None: the same name), and
    shards are fused (q/k/v_proj → qkv_proj, gate/up_proj → gate_up_proj per the model's
    packed_modules_mapping), so a sent shard counts as loaded when its fused parameter was."""
    fused_of = {shard: fused for fused, shards in packed_modules_mapping.items() for shard in shards}
    missing = []
    for sent_name in sent:
        name = param_name(sent_name) if param_name is not None else sent_name
        if name in loaded:
            continue
        parts = name.split(".")
        fused_names = {
            ".".join(parts[:i] + [fused_of[part]] + parts[i + 1 :]) for i, part in enumerate(parts) if part in fused_of
        }
        if not fused_names & loaded:
            missing.append(sent_name)
    return missing


# ---------------------------------------------------------------------- server mode (vllm_server.py)
#: vLLM's RequestOutputKind.FINAL_ONLY: a non-streaming request's one answer holds every token (an aborted one too)
FINAL_ONLY = 2


def build_server_args(ctx: RolloutContext, layout: EngineLayout, field_names: Iterable[str],
                      kernels: KernelInventory, host: str, port: int, extension: str) -> dict[str, Any]:
    """The arguments of the replica's vLLM server: those of the in-process LLM, with the server's own workers
    instead of the external launcher (in its process at tensor-parallel size 1, else one process per GPU of the
    group: vLLM's "uni" and "mp" executors) and verlx's weight receiver as worker extension."""
    args = build_llm_args(ctx, layout, field_names, kernels)
    args["distributed_executor_backend"] = "uni" if layout.tp_size == 1 else "mp"
    if args.get("worker_extension_cls"):
        raise ValueError(f"{ENGINE_KWARGS_KEY}.worker_extension_cls is set by verlx in server mode (its weight "
                         f"receiver, {extension}); remove it or turn actor_rollout_ref.rollout.server.enable off")
    return {**args, "worker_extension_cls": extension, "host": host, "port": port}


def server_sampling_params(params: SamplingParams, want_log_probs: bool) -> dict[str, Any]:
    """The sampling_params of a /inference/v1/generate request: the in-process ones, answered once (FINAL_ONLY)."""
    return {**vllm_sampling_kwargs(params, want_log_probs), "output_kind": FINAL_ONLY}


def parse_generate_response(answer: dict, n_samples: int, want_log_probs: bool,
                            request: str) -> list[tuple[list[int], list[float] | None, str]]:
    """A /inference/v1/generate answer → (token ids, log-probs, finish reason) per sample, in sample order.

    {"choices": [{"index", "token_ids", "finish_reason", "logprobs": {"content": [{"token": "token_id:<id>",
    "logprob"}, ...]}}]}: vLLM names each log-prob's token as "token_id:<id>" (clamped at -9999.0); they must be
    the sampled tokens. An aborted request (finish reason "abort") keeps the tokens it had.
    """
    choices = sorted(answer.get("choices") or [], key=lambda choice: choice["index"])
    if [choice["index"] for choice in choices] != list(range(n_samples)):
        raise EngineGenerationError(f"vllm server request {request}: choices {[c['index'] for c in choices]} for "
                                    f"{n_samples} requested samples")
    out = []
    for choice in choices:
        ids = [int(t) for t in choice.get("token_ids") or []]
        log_probs = None
        if want_log_probs:
            content = (choice.get("logprobs") or {}).get("content")
            if content is None or [entry["token"] for entry in content] != [f"token_id:{t}" for t in ids]:
                named = None if content is None else [entry["token"] for entry in content][:6]
                raise EngineGenerationError(f"vllm server request {request} sample {choice['index']}: log-probs "
                                            f"name tokens {named} but the sampled tokens are {ids[:6]}...")
            log_probs = [float(entry["logprob"]) for entry in content]
        out.append((ids, log_probs, str(choice.get("finish_reason"))))
    return out
