"""`rollout.name=vllm`: an in-process vLLM `LLM` per worker, tensor-parallel over consecutive ranks (SPMD).

With distributed_executor_backend="external_launcher" every worker process runs one vLLM worker; vLLM reuses the
already initialised torch.distributed world and groups consecutive blocks of tensor_parallel_size ranks into
independent replicas. TP peers receive identical prompts (the worker's dispatch info says so), submit them in the
same order with the same seed, and all return the same batch. Weights are loaded in place with the model's own
load_weights (which slices by TP rank and fuses q/k/v and gate/up), so CUDA graphs stay valid. The request stream
is LLMEngine's add_request / step / abort_request. vllm is imported only inside methods, after
VLLM_ENABLE_V1_MULTIPROCESSING=0 is set so the engine core runs in this process.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
from collections.abc import Iterable

import torch

from verlx.rollout.base import RolloutContext, SamplingParams
from verlx.rollout.external import ExternalEngine
from verlx.rollout.kernel_backends import inventory as kernel_inventory
from verlx.rollout.residency import KV_CACHE, WAKE_ORDER, EngineStateError
from verlx.rollout.stream import ABORT, Finished, RequestStream, StreamLimits
from verlx.rollout.vllm_adapter import (
    build_llm_args,
    completion_tokens,
    finish_of,
    unloaded_names,
    vllm_sampling_kwargs,
)
from verlx.rollout.weight_sync import WeightSyncError, bucket_bytes_of, engine_dtype, iter_buckets, iter_engine_weights
from verlx.utils.environ import scoped_environ
from verlx.utils.memory import ALLOC_CONF_ENV, alloc_conf_without_expandable_segments, set_expandable_segments

ENGINE = "vllm"
MODEL_RUNNER_PATH = "llm_engine.model_executor.driver_worker.worker.model_runner"


class VLLMRolloutEngine(ExternalEngine):
    name = "vllm"
    requires_package = "vllm"
    supports_partial_rollout = True
    tensor_parallel_in_lockstep = True

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        # The engine core must live in this process (the model is reached in place); read when vllm starts.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._llm = self._launch()
        model = self._model()
        self._param_names = frozenset(name for name, _ in model.named_parameters())
        self._packed = dict(getattr(model, "packed_modules_mapping", None) or {})
        self._streams = itertools.count()
        self._fully_awake: bool | None = None

    def _launch(self):
        """vllm.LLM(); collective across the world (every rank builds its replica's share at the same time)."""
        env: dict[str, str | None] = {
            # vLLM's external launcher reads LOCAL_RANK as an index into this process's visible devices
            "LOCAL_RANK": str(torch.cuda.current_device() if torch.cuda.is_available() else 0),
            "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"),
            # vLLM's sleep-mode allocator refuses expandable segments in the environment
            ALLOC_CONF_ENV: alloc_conf_without_expandable_segments(os.environ.get(ALLOC_CONF_ENV)),
        }
        set_expandable_segments(False)
        with scoped_environ(env):
            from vllm import LLM, EngineArgs

            fields = [f.name for f in dataclasses.fields(EngineArgs)]
            return LLM(**build_llm_args(self.ctx, self.layout, fields, kernel_inventory()))

    def _model(self) -> torch.nn.Module:
        """The in-process model: model_runner.get_model() unwraps CUDA-graph wrappers where the release has it."""
        target = self._llm
        try:
            for attr in MODEL_RUNNER_PATH.split("."):
                target = getattr(target, attr)
        except AttributeError:
            raise RuntimeError(
                f"cannot reach the model runner at LLM.{MODEL_RUNNER_PATH} in vllm {self.version}; weights cannot be "
                f"pushed in place (is VLLM_ENABLE_V1_MULTIPROCESSING=0 honoured by this release?)"
            ) from None
        return target.get_model() if hasattr(target, "get_model") else target.model

    def shutdown(self) -> None:
        self._llm = None

    # ------------------------------------------------------------------ generation
    def _open_stream(self, params: SamplingParams, partial: bool) -> VLLMStream:
        return VLLMStream(self._llm.llm_engine, params, self.stream_limits(), bool(self.config.calculate_log_probs),
                          partial, f"{next(self._streams)}-")

    # ------------------------------------------------------------------ memory
    def _release(self) -> None:
        """Sleep at rollout.sleep_level (1: weights to pinned CPU; 2: weights discarded), KV cache discarded."""
        self._llm.sleep(level=self.config.sleep_level)
        set_expandable_segments(True)

    def _resume(self, tag: str) -> None:
        set_expandable_segments(False)
        self._fully_awake = self._llm.wake_up(tags=[tag])

    def wake_up(self, tags: Iterable[str] = WAKE_ORDER) -> None:
        """Once both the weights and the KV cache are back, vLLM must say it is awake (releases from 0.27 do)."""
        self._fully_awake = None
        super().wake_up(tags)
        if self._fully_awake is False and not self.residency.to_resume(WAKE_ORDER):
            raise EngineStateError("vllm reports it is still asleep after waking weights and kv_cache")

    # ------------------------------------------------------------------ weights
    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors bucket by bucket with the model's load_weights, checking each bucket's names came
        back as loaded; a push that covers every parameter makes discarded (level 2) weights usable again."""
        set_expandable_segments(False)
        model = self._model()
        weights = iter_engine_weights(
            named_tensors, engine_dtype(self.config.dtype), self.tie_word_embeddings, device=self.ctx.device
        )
        loaded_total: set[str] = set()
        pushed: set[str] = set()
        for bucket in iter_buckets(weights, bucket_bytes_of(self.config)):
            names = [name for name, _ in bucket]
            pushed.update(names)
            try:
                loaded = model.load_weights(weights=bucket)
            except Exception as e:
                raise WeightSyncError(ENGINE, names, f"model.load_weights raised {type(e).__name__}: {e}") from e
            if loaded is None:
                raise WeightSyncError(
                    ENGINE, names, f"{type(model).__name__}.load_weights returned no loaded names, so the update "
                    f"cannot be verified; this model class is not supported for weight sync"
                )
            loaded = set(loaded)
            missing = unloaded_names(names, loaded, self._packed)
            if missing:
                raise WeightSyncError(
                    ENGINE, missing, f"model.load_weights did not load them (it loaded {sorted(loaded)[:6]}...)"
                )
            loaded_total |= loaded
        if (KV_CACHE in self.residency.resident and self.config.enable_prefix_caching
                and self._llm.reset_prefix_cache() is False):
            raise WeightSyncError(ENGINE, ["<reset_prefix_cache>"], "vLLM refused to reset the prefix cache")
        # complete: every checkpoint tensor was sent (a fused qkv / gate_up counts as loaded after one shard) and
        # every vLLM parameter was loaded
        return self._unset(pushed) | (self._param_names - loaded_total)


class VLLMStream(RequestStream):
    """LLMEngine.add_request per request (n=1, the stream's sampling settings and the request's budget), step() per
    round (vLLM batches continuously), abort_request to cancel. Outputs come once per request (FINAL_ONLY), or, when
    a cancelled request must return its tokens (partial rollout), as the new tokens of every step (DELTA)."""

    def __init__(self, llm_engine, params: SamplingParams, limits: StreamLimits, want_log_probs: bool, partial: bool,
                 prefix: str):
        super().__init__(params, limits, want_log_probs)
        from vllm.sampling_params import RequestOutputKind

        self.llm_engine, self.prefix = llm_engine, prefix
        self.output_kind = RequestOutputKind.DELTA if partial else RequestOutputKind.FINAL_ONLY
        self.delta = partial
        self._live: dict[str, tuple[list[int], list[float]]] = {}  # vLLM request id -> tokens, log-probs so far

    def _submit(self, key, prompt_ids, max_new_tokens, seed, follows) -> None:
        from vllm import SamplingParams as VLLMSamplingParams
        from vllm.inputs import TokensPrompt

        params = dataclasses.replace(self.params, n=1, max_new_tokens=max_new_tokens)
        sampling = VLLMSamplingParams(**vllm_sampling_kwargs(params, self.want_log_probs))
        sampling.output_kind = self.output_kind
        request_id = self.prefix + key
        self.llm_engine.add_request(request_id, TokensPrompt(prompt_token_ids=prompt_ids), sampling)
        self._live[request_id] = ([], [])

    def _step(self) -> list[Finished]:
        done = []
        for output in self.llm_engine.step():
            if output.request_id not in self._live:
                continue  # finished or cancelled already
            completion = output.outputs[0]
            ids, lps = completion_tokens(completion, self.want_log_probs, output.request_id)
            tokens, log_probs = self._live[output.request_id]
            tokens += ids
            log_probs += lps or []
            if getattr(output, "finished", False):
                del self._live[output.request_id]
                reason, detail = finish_of(completion)
                key = output.request_id.removeprefix(self.prefix)
                done.append(Finished(key, tokens, log_probs if self.want_log_probs else None, reason, detail))
        return done

    def _cancel(self, keys: set[str]) -> list[Finished]:
        request_ids = [request_id for request_id in self._live if request_id.removeprefix(self.prefix) in keys]
        if request_ids:
            self.llm_engine.abort_request(request_ids)
        out = []
        for request_id in request_ids:
            tokens, log_probs = self._live.pop(request_id)
            out.append(Finished(request_id.removeprefix(self.prefix), tokens,
                                log_probs if self.want_log_probs else None, ABORT))
        return out
