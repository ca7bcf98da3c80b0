"""`rollout.name=vllm`: an in-process vLLM `LLM` per worker, tensor-parallel over consecutive ranks (SPMD), or in
server mode (rollout.server.enable) vLLM's own HTTP server per replica (vllm_server.py).

In-process, with distributed_executor_backend="external_launcher" every worker process runs one vLLM worker; vLLM
reuses the already initialised torch.distributed world and groups consecutive blocks of tensor_parallel_size ranks
into independent replicas. TP peers receive identical prompts (the worker's dispatch info says so), submit them in
the same order with the same seed, and all return the same batch. Weights are loaded in place with the model's own
load_weights (which slices by TP rank and fuses q/k/v and gate/up), so CUDA graphs stay valid. The request stream
is LLMEngine's add_request / step / abort_request. vllm is imported only inside methods, after
VLLM_ENABLE_V1_MULTIPROCESSING=0 is set so the engine core runs in this process.

In server mode the group's first rank starts the server on the group's GPUs and drives it (the generation runs
there and its result goes to the peers, as SGLang's); weights go bucket by bucket as CUDA-IPC handles of every
rank's own full copy to the same load_weights inside vLLM's workers (vllm_weight_receiver.py), checked the same way;
the request stream is /inference/v1/generate per prompt.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
from collections.abc import Callable, Iterable

import torch

from verlx.models.vision import VisionLanguageModel
from verlx.rollout.base import RolloutContext, SamplingParams, T
from verlx.rollout.engine_layout import engine_visible_devices
from verlx.rollout.external import ExternalEngine
from verlx.rollout.image_requests import image_prompt, vllm_prompt
from verlx.rollout.kernel_backends import inventory as kernel_inventory
from verlx.rollout.residency import KV_CACHE, WAKE_ORDER, EngineStateError
from verlx.rollout.stream import ABORT, Finished, RequestStream, StreamLimits
from verlx.rollout.task_stream import TaskStream
from verlx.rollout.tp_group import TensorParallelGroup
from verlx.rollout.vllm_adapter import (
    build_llm_args,
    build_server_args,
    completion_tokens,
    finish_of,
    parse_generate_response,
    server_sampling_params,
    takes_flat_logprobs,
    unloaded_names,
    vision_language_param_name,
    vllm_sampling_kwargs,
)
from verlx.rollout.vllm_weight_receiver import packed_modules_mapping_of
from verlx.rollout.weight_sync import WeightSyncError, bucket_bytes_of, engine_dtype, iter_buckets, iter_engine_weights
from verlx.utils.environ import scoped_environ
from verlx.utils.memory import ALLOC_CONF_ENV, alloc_conf_without_expandable_segments, set_expandable_segments

logger = logging.getLogger(__name__)
ENGINE = "vllm"
MODEL_RUNNER_PATH = "llm_engine.model_executor.driver_worker.worker.model_runner"


class VLLMRolloutEngine(ExternalEngine):
    name = "vllm"
    requires_package = "vllm"
    supports_partial_rollout = True
    supports_server = True  # rollout.server.enable: vLLM's OpenAI-compatible server per replica (vllm_server.py)
    tensor_parallel_in_lockstep = True  # in-process only: in server mode the group's first rank drives its server
    #: Qwen2-VL, Qwen2.5-VL, Qwen3-VL in-process: multi_modal_data beside the prompt ids (rollout/image_requests.py);
    #: not in server mode, where verlx's /inference/v1/generate requests carry token ids only
    supports_image_input = True
    context_limit_override_env = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        self.server_mode = bool(self.config.server.enable)
        self._streams = itertools.count()
        self._fully_awake: bool | None = None
        #: vllm.LLM, or in server mode the server's client (on the group's first rank only)
        self._engine = None
        if self.server_mode:
            self.tp = TensorParallelGroup.create(self.layout)
            peers = self.tp.all_gather(os.environ.get("CUDA_VISIBLE_DEVICES"))
            self.tp.run_checked(lambda: self._start_server(peers), "vllm server start")
            try:
                info = self.tp.run_on_leader(lambda: self._engine.model_info())
            except BaseException:
                if self._engine is not None:  # no server is left holding the GPU and the port; its log is kept
                    self._engine.shutdown(keep_log=True)
                    self._engine = None
                raise
            param_names, packed = info["param_names"], info["packed_modules_mapping"]
        else:
            # The engine core must live in this process (the model is reached in place); read when vllm starts.
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
            self._engine = self._launch()
            model = self._model()
            param_names = [name for name, _ in model.named_parameters()]
            packed = packed_modules_mapping_of(model)
        self._param_names = frozenset(param_names)
        self._packed = dict(packed)
        #: the vLLM parameter a pushed name loads into (its model class renames a vision-language checkpoint's)
        self._param_name = vision_language_param_name if self.vision is not None else None

    @staticmethod
    def _engine_env() -> dict[str, str | None]:
        return {
            "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE", "0"),
            # vLLM's sleep-mode allocator refuses expandable segments in the environment
            ALLOC_CONF_ENV: alloc_conf_without_expandable_segments(os.environ.get(ALLOC_CONF_ENV)),
        }

    def _launch(self):
        """vllm.LLM(); collective across the world (every rank builds its replica's share at the same time)."""
        env = {
            # vLLM's external launcher reads LOCAL_RANK as an index into this process's visible devices
            "LOCAL_RANK": str(torch.cuda.current_device() if torch.cuda.is_available() else 0),
            **self._engine_env(),
        }
        set_expandable_segments(False)
        with scoped_environ(env):
            from vllm import LLM, EngineArgs

            fields = [f.name for f in dataclasses.fields(EngineArgs)]
            return LLM(**build_llm_args(self.ctx, self.layout, fields, kernel_inventory()))

    def _start_server(self, peer_devices: list[str | None]) -> None:
        """The group's first rank starts the server on the group's GPUs (`peer_devices`: every rank's
        CUDA_VISIBLE_DEVICES, in tp-rank order)."""
        from vllm import EngineArgs

        from verlx.rollout.engine_server import server_environment, server_port
        from verlx.rollout.vllm_server import SERVER_ENV, VLLMServer
        from verlx.rollout.vllm_weight_receiver import EXTENSION

        visible, _ = engine_visible_devices(self.layout, peer_devices)
        if not self.layout.launches_engine:
            return
        server = self.config.server
        fields = [f.name for f in dataclasses.fields(EngineArgs)]
        self.server_args = build_server_args(self.ctx, self.layout, fields, kernel_inventory(), server.host,
                                             server_port(self.layout, server.port), EXTENSION)
        env = {**SERVER_ENV, **self._engine_env()}
        if visible is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible
        self._engine = VLLMServer.launch(self.server_args, server_environment(env), float(server.startup_timeout_s),
                                         self.ctx.rank, log_dir=server.log_dir)
        logger.info("rollout rank %d: vllm server at %s (log %s)", self.ctx.rank, self._engine.url,
                    self._engine.log_path)

    @property
    def server_url(self) -> str | None:
        """Where this replica's server answers (server mode, on the rank that started it), for an agent framework
        that sends its own requests during the rollout."""
        return self._engine.url if self.server_mode and self._engine is not None else None

    def _model(self) -> torch.nn.Module:
        """The in-process model: model_runner.get_model() unwraps CUDA-graph wrappers where the release has it."""
        target = self._engine
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
        if self.server_mode and self._engine is not None:
            self._engine.shutdown()
        self._engine = None

    def _on_engine(self, fn: Callable[[], T]) -> T:
        """Where the engine is called: on every rank in-process (SPMD), on the group's first rank in server mode
        (its result, or its error, on every rank)."""
        return self.tp.run_on_leader(fn) if self.server_mode else fn()

    # ------------------------------------------------------------------ generation
    def drive(self, generation: Callable[[], T]) -> T:
        return self._on_engine(generation)

    def _open_stream(self, params: SamplingParams, partial: bool) -> RequestStream:
        want_log_probs = bool(self.config.calculate_log_probs)
        if self.server_mode:
            return VLLMServerStream(self._engine, params, self.stream_limits(), want_log_probs,
                                    f"verlx-{next(self._streams)}-")
        return VLLMStream(self._engine.llm_engine, params, self.stream_limits(), want_log_probs, partial,
                          f"{next(self._streams)}-", self.vision)

    # ------------------------------------------------------------------ memory
    def unbacked_allocated_bytes(self) -> int:
        """In-process, vLLM's sleep unmaps its pool's memory while its tensors stay allocated to torch: the bytes of
        the pool's allocations that are asleep (none in server mode: the engine lives in its own process)."""
        if self.server_mode:
            return 0
        from vllm.device_allocator.cumem import CuMemAllocator

        allocations = CuMemAllocator.get_instance().pointer_to_data.values()
        return sum(allocation.handle[1] for allocation in allocations if allocation.is_asleep)

    def _release(self) -> None:
        """Sleep at rollout.sleep_level (1: weights to pinned CPU; 2: weights discarded), KV cache discarded."""
        self._on_engine(lambda: self._engine.sleep(level=self.config.sleep_level))
        set_expandable_segments(True)

    def _resume(self, tag: str) -> None:
        set_expandable_segments(False)
        self._fully_awake = self._on_engine(lambda: self._engine.wake_up(tags=[tag]))

    def wake_up(self, tags: Iterable[str] = WAKE_ORDER) -> None:
        """Once both the weights and the KV cache are back, vLLM must say it is awake (releases from 0.27 do; in
        server mode /is_sleeping)."""
        self._fully_awake = None
        super().wake_up(tags)
        if self._fully_awake is False and not self.residency.to_resume(WAKE_ORDER):
            raise EngineStateError("vllm reports it is still asleep after waking weights and kv_cache")

    # ------------------------------------------------------------------ weights
    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load HF-named tensors bucket by bucket with the model's load_weights, checking each bucket's names came
        back as loaded (in server mode from every worker); a push that covers every parameter makes discarded
        (level 2) weights usable again."""
        set_expandable_segments(False)  # CUDA IPC (server mode) cannot share tensors in expandable segments
        weights = iter_engine_weights(
            named_tensors, engine_dtype(self.config.dtype), self.tie_word_embeddings, device=self.ctx.device,
            rename=self.engine_weight_name)
        loaded_total: set[str] = set()
        pushed: set[str] = set()
        for bucket in iter_buckets(weights, bucket_bytes_of(self.config)):
            names = [name for name, _ in bucket]
            pushed.update(names)
            for loaded in self._load_bucket(bucket, names):
                missing = unloaded_names(names, loaded, self._packed, self._param_name)
                if missing:
                    raise WeightSyncError(
                        ENGINE, missing, f"model.load_weights did not load them (it loaded {sorted(loaded)[:6]}...)"
                    )
                loaded_total |= loaded
        if (KV_CACHE in self.residency.resident and self.config.enable_prefix_caching
                and self._on_engine(lambda: self._engine.reset_prefix_cache()) is False):
            raise WeightSyncError(ENGINE, ["<reset_prefix_cache>"], "vLLM refused to reset the prefix cache")
        # complete: every checkpoint tensor was sent (a fused qkv / gate_up counts as loaded after one shard) and
        # every vLLM parameter was loaded
        return self._unset(pushed) | (self._param_names - loaded_total)

    def _load_bucket(self, bucket: list[tuple[str, torch.Tensor]], names: list[str]) -> list[set[str]]:
        """One bucket into the model: the vLLM names loaded, per model copy (in server mode one per worker)."""
        if self.server_mode:
            answers = self._push_to_server(bucket, names)
        else:
            try:
                answers = [self._model().load_weights(weights=bucket)]
            except Exception as e:
                raise WeightSyncError(ENGINE, names, f"model.load_weights raised {type(e).__name__}: {e}") from e
        if any(loaded is None for loaded in answers):
            raise WeightSyncError(
                ENGINE, names, "the model's load_weights returned no loaded names, so the update cannot be verified; "
                "this model class is not supported for weight sync"
            )
        return [set(loaded) for loaded in answers]

    def _push_to_server(self, bucket: list[tuple[str, torch.Tensor]], names: list[str]) -> list:
        """Every rank's handles to its own copy of the bucket, gathered on the first rank, which sends them in one
        /collective_rpc; the tensors stay referenced until every rank knows the server has returned."""
        from verlx.rollout.vllm_weight_receiver import encode_bucket, tensor_handle

        handles = self.tp.gather_to_leader([(name, tensor_handle(tensor)) for name, tensor in bucket])

        def push() -> list:
            merged = [(name, {}) for name in names]
            for tp_rank, rank_handles in enumerate(handles):
                if [name for name, _ in rank_handles] != names:
                    raise WeightSyncError(ENGINE, names, f"tensor-parallel rank {tp_rank} pushed other parameters; "
                                          "every rank must iterate the same parameters in the same order")
                for (_, by_device), (_, handle) in zip(merged, rank_handles):
                    by_device.update(handle)
            try:
                return self._engine.load_weights(encode_bucket(merged))
            except RuntimeError as e:
                raise WeightSyncError(ENGINE, names, str(e)) from e

        return self.tp.run_on_leader(push)


class VLLMStream(RequestStream):
    """LLMEngine.add_request per request (n=1, the stream's sampling settings and the request's budget), step() per
    round (vLLM batches continuously), abort_request to cancel. Outputs come once per request (FINAL_ONLY), or, when
    a cancelled request must return its tokens (partial rollout), as the new tokens of every step (DELTA)."""

    def __init__(self, llm_engine, params: SamplingParams, limits: StreamLimits, want_log_probs: bool, partial: bool,
                 prefix: str, vision: VisionLanguageModel | None = None):
        super().__init__(params, limits, want_log_probs)
        from vllm.sampling_params import RequestOutputKind
        from vllm.sampling_params import SamplingParams as VLLMSamplingParams

        self.llm_engine, self.prefix, self.vision = llm_engine, prefix, vision
        self.output_kind = RequestOutputKind.DELTA if partial else RequestOutputKind.FINAL_ONLY
        self.sampling_params_type = VLLMSamplingParams
        self.flat_logprobs = want_log_probs and takes_flat_logprobs(VLLMSamplingParams)
        self.delta = partial
        self._live: dict[str, tuple[list[int], list[float]]] = {}  # vLLM request id -> tokens, log-probs so far

    def _submit(self, key, prompt_ids, max_new_tokens, seed, follows) -> None:
        from vllm.inputs import TokensPrompt

        params = dataclasses.replace(self.params, n=1, max_new_tokens=max_new_tokens)
        sampling = self.sampling_params_type(**vllm_sampling_kwargs(params, self.want_log_probs, self.flat_logprobs))
        sampling.output_kind = self.output_kind
        request_id = self.prefix + key
        ids, images = image_prompt(prompt_ids, self.vision_inputs.get(key), self.images.get(key), self.vision)
        self.llm_engine.add_request(request_id, TokensPrompt(**vllm_prompt(ids, images)), sampling)
        self._live[request_id] = ([], [])

    def _step(self) -> list[Finished]:
        done = []
        for output in self.llm_engine.step():
            if output.request_id not in self._live:
                continue  # finished or cancelled already
            completion = output.outputs[0]
            ids, lps = completion_tokens(completion, self.want_log_probs, output.request_id, self.flat_logprobs)
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


class VLLMServerStream(TaskStream):
    """/inference/v1/generate per prompt (its samples as one request with n: vLLM prefills the prompt once for all of
    them), a task on the client's event loop; a cancel aborts the prompt's request by name, never everything (the
    server may be answering an agent framework's requests too), and the aborted request answers with its tokens."""

    def __init__(self, server, params: SamplingParams, limits: StreamLimits, want_log_probs: bool, prefix: str):
        super().__init__(server.loop, params, limits, want_log_probs, prefix)
        self.server = server
        self._request_of: dict[str, str] = {}  # a sample's request id -> the id its prompt's request went with

    def _request(self, request_ids, prompt_ids, params):
        if self.images:  # preflight refuses it (supports_server_image_input); never drop a prompt's images
            raise ValueError("vllm in server mode does not take image inputs; turn actor_rollout_ref.rollout.server."
                             "enable off or use actor_rollout_ref.rollout.name=sglang")
        self._request_of.update((request_id, request_ids[0]) for request_id in request_ids)
        return self.server.generate(request_ids[0], prompt_ids, server_sampling_params(params, self.want_log_probs))

    def _finished(self, result, keys):
        for key in keys:
            self._request_of.pop(self.prefix + key, None)
        samples = parse_generate_response(result, len(keys), self.want_log_probs, self.prefix + keys[0])
        return [Finished(key, ids, log_probs if self.want_log_probs else None, reason)
                for key, (ids, log_probs, reason) in zip(keys, samples)]

    def _abort(self, request_ids, every_running):
        self.server.abort(sorted({self._request_of[request_id] for request_id in request_ids}))
