"""`rollout.name=vllm`: an in-process vLLM `LLM` per worker, tensor-parallel over consecutive ranks (SPMD).

With distributed_executor_backend="external_launcher" every worker process runs one vLLM worker; vLLM reuses the
already initialised torch.distributed world and groups consecutive blocks of tensor_parallel_size ranks into
independent replicas. TP peers receive identical prompts (the worker's dispatch info says so), submit them in the
same order with the same seed, and all return the same batch. Weights are loaded in place with the model's own
load_weights (which slices by TP rank and fuses q/k/v and gate/up), so CUDA graphs stay valid. vllm is imported
only inside methods, after VLLM_ENABLE_V1_MULTIPROCESSING=0 is set so the engine core runs in this process.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable

import torch

from verlx.protocol import DataProto
from verlx.rollout.base import RolloutContext
from verlx.rollout.external import ExternalEngine
from verlx.rollout.kernel_backends import inventory as kernel_inventory
from verlx.rollout.residency import KV_CACHE, EngineStateError
from verlx.rollout.token_io import prompt_token_lists, require_full_length, rollout_batch_from_result
from verlx.rollout.vllm_adapter import build_llm_args, parse_vllm_outputs, unloaded_names, vllm_sampling_kwargs
from verlx.rollout.weight_sync import WeightSyncError, bucket_bytes_of, engine_dtype, iter_buckets, iter_engine_weights
from verlx.utils.environ import scoped_environ
from verlx.utils.memory import ALLOC_CONF_ENV, alloc_conf_without_expandable_segments, set_expandable_segments

ENGINE = "vllm"
MODEL_RUNNER_PATH = "llm_engine.model_executor.driver_worker.worker.model_runner"


class VLLMRolloutEngine(ExternalEngine):
    requires_package = "vllm"

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        # The engine core must live in this process (the model is reached in place); read when vllm starts.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        self._llm = self._launch()
        model = self._model()
        self._param_names = frozenset(name for name, _ in model.named_parameters())
        self._packed = dict(getattr(model, "packed_modules_mapping", None) or {})
        # Level 1 keeps weights in pinned CPU memory while asleep; level 2 discards them.
        self.residency = self._new_residency(weights_survive_release=self.config.sleep_level == 1)

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
    def generate(self, prompts: DataProto) -> DataProto:
        params = self._sampling_for(prompts)
        cfg = self.config
        want_log_probs = bool(cfg.calculate_log_probs)
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        requests = [TokensPrompt(prompt_token_ids=ids) for ids in prompt_token_lists(prompts)]
        sampling = SamplingParams(**vllm_sampling_kwargs(params, want_log_probs))
        outputs = self._llm.generate(requests, sampling_params=sampling, use_tqdm=False)
        result = parse_vllm_outputs(outputs, params.n, want_log_probs)
        require_full_length("vllm", result, params.max_new_tokens)
        return rollout_batch_from_result(prompts, result, params.n, cfg.response_length, self.ctx.pad_token_id)

    # ------------------------------------------------------------------ memory
    def sleep(self) -> None:
        """Sleep at rollout.sleep_level (1: weights to pinned CPU; 2: weights discarded), KV cache discarded."""
        if not self.config.free_cache_engine or self.residency.asleep:
            return
        self._llm.sleep(level=self.config.sleep_level)
        self.residency.mark_released()
        set_expandable_segments(True)

    def wake_up(self, tags: Iterable[str] = ("weights", "kv_cache")) -> None:
        """Wake weights before the push and the KV cache after it; once both are back vLLM must say it is awake."""
        if not self.config.free_cache_engine:
            return
        set_expandable_segments(False)
        for tag in self.residency.to_resume(tags):
            fully_awake = self._llm.wake_up(tags=[tag])
            self.residency.mark_resumed([tag])
            if not self.residency.to_resume(("weights", "kv_cache")) and fully_awake is False:
                raise EngineStateError("vllm reports it is still asleep after waking weights and kv_cache")

    # ------------------------------------------------------------------ weights
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load HF-named tensors bucket by bucket with the model's load_weights, checking each bucket's names came
        back as loaded; a push that covers every parameter makes discarded (level 2) weights usable again."""
        self.residency.require_weights_resident()
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
        self._finish_push(pushed, self._param_names - loaded_total)
