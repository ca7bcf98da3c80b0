"""SGLang's side of the rollout contract, as pure functions: Engine arguments, sampling parameters, reading outputs.

Kept apart from the engine class so every mapping is checked on machines without SGLang. Facts follow the
documented sglang 0.5.9–0.5.23 in-process API (docs/rollout.md lists them).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

from packaging.version import Version

from verlx.models.vision import vision_language_model
from verlx.rollout.base import RolloutContext, SamplingParams
from verlx.rollout.engine_layout import EngineLayout
from verlx.rollout.engine_versions import at_least
from verlx.rollout.kernel_backends import KernelInventory, sglang_backends
from verlx.rollout.token_io import EngineGenerationError
from verlx.utils.registry import did_you_mean

logger = logging.getLogger(__name__)

ENGINE_KWARGS_KEY = "actor_rollout_ref.rollout.engine_kwargs.sglang"
# SGLang's scheduler clips max_new_tokens to context_length - input_len - 2 (its max_req_len is context_length - 1,
# less one more token); without this margin every forced-length response came back 2 tokens short (GPU, 0.5.17).
SGLANG_CONTEXT_MARGIN = 2
#: Engine arguments verlx derives from the mesh and the sleep cycle; overriding them breaks placement or sync.
MANAGED_SERVER_ARGS = frozenset(
    {
        "model_path",
        "skip_tokenizer_init",
        "enable_memory_saver",
        "enable_weights_cpu_backup",
        "tp_size",
        "dp_size",
        "base_gpu_id",
        "gpu_id_step",
        "nnodes",
        "node_rank",
        "dist_init_addr",
        "host",
        "port",
        "nccl_port",
    }
)


@dataclass(frozen=True)
class SGLangFeatures:
    """Release-dependent behaviour of the SGLang API."""

    version: Version

    @property
    def msgspec_server_args(self) -> bool:
        """ServerArgs is a msgspec Struct from 0.5.20 (a dataclass before)."""
        return at_least(self.version, "0.5.20")

    @property
    def weight_update_session(self) -> bool:
        """From 0.5.21 a weight update outside begin/end_weight_update returns (False, msg) without raising."""
        return at_least(self.version, "0.5.21")

    def construction_env(self) -> dict[str, str]:
        """Environment the Engine (and the processes it spawns) must see while it is built."""
        return {
            # Colocated trainers hold different amounts of memory per GPU; SGLang's TP balance check would abort.
            # From 0.5.9 only this name is read (the old SGL_DISABLE_TP_MEMORY_INBALANCE_CHECK is ignored).
            "SGLANG_ENABLE_TP_MEMORY_INBALANCE_CHECK": "false",
            # Non-zero nodes of a multi-node group must return from Engine() instead of blocking the worker.
            "SGLANG_BLOCK_NONZERO_RANK_CHILDREN": "0",
            # torch_memory_saver and NCCL graph buffer registration do not mix.
            "NCCL_GRAPH_REGISTER": "0",
            # A prompt with images keeps verlx's ids, each image token expanded to its image's count, instead of
            # being decoded to text and tokenized again (on by default in 0.5.17; said here so no release differs).
            "SGLANG_MM_AVOID_RETOKENIZE": "true",
        }


def megatron_core_importable() -> bool:
    """Whether SGLang's scheduler processes will import megatron-core (its debug dumper does whenever it can)."""
    return importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None


def graph_memory_env(server_args: dict[str, Any], megatron_importable: bool) -> dict[str, str]:
    """Let the release pause the CUDA graphs' pool too (8.4 GiB stayed on the GPU under a sleeping 0.5B engine,
    0.5.17 on an H100). SGLang's breakable prefill graphs refuse that mode, so only when prefill graphs are off.

    Nor where megatron-core is importable: SGLang's scheduler imports it (sglang/srt/debug_utils/dumper.py), and
    importing megatron.core switches torch_memory_saver to its "torch" hook mode (megatron/core/inference/contexts/
    dynamic_context.py), which cannot pause CUDA graphs: the engine's start fails on "Only hook_mode=preload supports
    pauseable CUDA Graph currently" (SGLang 0.5.17 with megatron-core 0.16.1, 4 × H100, 2026-11-26)."""
    if not server_args.get("disable_prefill_cuda_graph") or server_args.get("disable_cuda_graph"):
        return {}
    if megatron_importable:
        logger.warning("SGLang's CUDA graphs stay on the GPU while the engine sleeps (rollout/engine_asleep_gb shows "
                       "what it keeps): megatron-core is importable here, and once SGLang's scheduler imports it, "
                       "torch_memory_saver cannot pause CUDA graphs")
        return {}
    return {"SGLANG_MEMORY_SAVER_CUDA_GRAPH": "1"}


def server_arg_names(server_args_cls: type, features: SGLangFeatures) -> frozenset[str]:
    """Field names of sglang's ServerArgs: msgspec fields on 0.5.20+, dataclass fields before."""
    if features.msgspec_server_args:
        import msgspec

        return frozenset(f.name for f in msgspec.structs.fields(server_args_cls))
    return frozenset(f.name for f in dataclasses.fields(server_args_cls))


def _dtype_arg(dtype: str) -> str:
    return {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}.get(dtype, dtype)


def build_server_args(
    ctx: RolloutContext,
    layout: EngineLayout,
    field_names: frozenset[str],
    *,
    base_gpu_id: int,
    dist_init_addr: str | None,
    weights_cpu_backup: bool,
    kernels: KernelInventory,
) -> dict[str, Any]:
    """Keyword arguments of sglang.Engine for this rank's engine; user engine_kwargs are checked against
    ServerArgs and may not override what the mesh decides. Attention/sampling backends whose kernels are missing
    here are replaced (logged) unless engine_kwargs names them."""
    cfg = ctx.config
    ours: dict[str, Any] = dict(
        model_path=ctx.model_path,
        tokenizer_path=ctx.tokenizer_path or ctx.model_path,
        skip_tokenizer_init=True,
        trust_remote_code=ctx.trust_remote_code,
        dtype=_dtype_arg(cfg.dtype),
        load_format="dummy" if cfg.load_format.startswith("dummy") else cfg.load_format,
        mem_fraction_static=cfg.gpu_memory_utilization,
        enable_memory_saver=True,
        enable_weights_cpu_backup=weights_cpu_backup,
        tp_size=layout.tp_size,
        dp_size=1,
        base_gpu_id=base_gpu_id,
        gpu_id_step=layout.gpu_id_step,
        nnodes=layout.engine_nnodes,
        node_rank=layout.engine_node_rank,
        dist_init_addr=dist_init_addr,
        port=layout.port,
        nccl_port=layout.nccl_port,
        random_seed=cfg.seed + layout.dp_rank,
        context_length=(cfg.max_model_len or cfg.prompt_length + cfg.response_length) + SGLANG_CONTEXT_MARGIN,
        max_running_requests=cfg.max_num_seqs,
        chunked_prefill_size=cfg.max_num_batched_tokens if cfg.enable_chunked_prefill else -1,
        disable_cuda_graph=cfg.enforce_eager,
        # RL prefills are long batches (little for a graph to gain), and without prefill graphs the decode graphs'
        # pool can be released while asleep (graph_memory_env).
        disable_prefill_cuda_graph=True,
        disable_radix_cache=not cfg.enable_prefix_caching,
        log_level="error",
    )
    user = {k: v for k, v in dict(cfg.engine_kwargs.sglang or {}).items() if v is not None}
    backends = sglang_backends(kernels, user, vision=vision_language_model(ctx.hf_config) is not None)
    ours.update(backends.args)
    if backends.reasons:
        logger.warning("sglang: choosing %s; set %s.<key> to override", "; ".join(backends.reasons), ENGINE_KWARGS_KEY)
    dropped = sorted(k for k in ours if k not in field_names)
    if dropped:
        logger.info("sglang ServerArgs of this release lacks %s; not passing them", dropped)
    args = {k: v for k, v in ours.items() if k in field_names}
    for key in user:
        if key in MANAGED_SERVER_ARGS:
            raise ValueError(
                f"{ENGINE_KWARGS_KEY}.{key} is set by verlx from the worker mesh and the sleep cycle; remove it "
                f"(use rollout.tensor_model_parallel_size / rollout.sleep_level instead)"
            )
        if key not in field_names:
            raise ValueError(
                f"{ENGINE_KWARGS_KEY}.{key} is not an argument of sglang.Engine (ServerArgs) in this release."
                + did_you_mean(key, field_names)
            )
    args.update(user)
    return args


def sglang_sampling_params(params: SamplingParams) -> dict[str, Any]:
    """SamplingParams → SGLang's sampling_params dict.

    Greedy is temperature 0 with top_p 1 and top_k -1 (all); top_k 0 also means all (SGLang only accepts -1).
    stop_token_ids are the EOS ids, so ignore_eos drops them too (SGLang would otherwise stop on them anyway).
    no_stop_trim keeps the stop token in output_ids: the response mask includes it.
    The step seed is not passed as sampling_seed: SGLang's seeded sampler draws the same noise for the same (seed,
    position), so the n samples of one prompt would be identical; the engine's random_seed (per replica) is used.
    """
    greedy = params.greedy
    out: dict[str, Any] = dict(
        n=params.n,
        max_new_tokens=params.max_new_tokens,
        min_new_tokens=params.min_new_tokens,
        temperature=0.0 if greedy else float(params.temperature),
        top_p=1.0 if greedy else float(params.top_p),
        top_k=-1 if greedy or params.top_k <= 0 else int(params.top_k),
        ignore_eos=params.ignore_eos,
        stop_token_ids=[] if params.ignore_eos else [int(t) for t in params.stop_token_ids],
        no_stop_trim=True,
        skip_special_tokens=False,
    )
    return out


def _finish_reason(meta: dict) -> tuple[str, str]:
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        return str(reason.get("type")), str(reason.get("message") or "")
    return str(reason), ""


@dataclass
class SGLangOutput:
    """One sample of an Engine.generate / async_generate result."""

    token_ids: list[int]
    log_probs: list[float] | None
    finish_reason: str  # stop | length | abort
    detail: str  # the engine's message (why it aborted)


def parse_sglang_outputs(outputs: list[dict] | dict, n_samples: int, want_log_probs: bool) -> list[SGLangOutput]:
    """A generate result (a dict for one sample, a list grouped per prompt when n > 1) → its samples.

    Each output: {"output_ids": [...], "meta_info": {"finish_reason": {"type": ..., "message": ...},
    "output_token_logprobs": [(logprob, token_id, text|None), ...]}}; the log-prob entries must name the same tokens
    as output_ids. An aborted request (cancelled, or refused by the engine) keeps the tokens it had.
    """
    if isinstance(outputs, dict):
        outputs = [outputs]
    if len(outputs) != n_samples:
        raise EngineGenerationError(f"sglang returned {len(outputs)} outputs for {n_samples} requested samples")
    parsed = []
    for i, out in enumerate(outputs):
        meta = out["meta_info"]
        reason, message = _finish_reason(meta)
        ids = [int(t) for t in out["output_ids"]]
        log_probs = None
        if want_log_probs:
            entries = meta.get("output_token_logprobs")
            if entries is None:
                raise EngineGenerationError(f"sglang output {i} has no meta_info.output_token_logprobs")
            if [int(e[1]) for e in entries] != ids:
                raise EngineGenerationError(
                    f"sglang output {i}: output_token_logprobs name tokens {[e[1] for e in entries][:8]}... but "
                    f"output_ids are {ids[:8]}..."
                )
            log_probs = [float(e[0]) for e in entries]
        parsed.append(SGLangOutput(ids, log_probs, reason, message))
    return parsed
