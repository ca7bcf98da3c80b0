"""`rollout.name=sglang`: an in-process SGLang Engine per tensor-parallel group of the worker mesh.

Per group, the first rank on each node builds a `sglang.Engine` whose scheduler processes sit on the group's GPUs
of that node; tp_rank 0 (the leader) drives it: generation, release/resume memory, weight updates. Every rank of a
group receives the same prompts (the worker's dispatch info says so); the leader runs the whole generation over its
request stream (`async_generate` per request on the engine's event loop) and hands the result to its peers, so every
rank returns the same batch. Weights travel by CUDA IPC: each rank serialises a handle to its own full copy of a
tensor, the leader gathers the handles and SGLang's TP rank i opens handle i on its GPU. sglang is imported only
inside methods.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing as mp
import os
import socket
from collections.abc import Callable, Iterable

import torch

from verlx.models.vision import VisionLanguageModel
from verlx.rollout.base import RolloutContext, SamplingParams, T
from verlx.rollout.engine_layout import engine_visible_devices
from verlx.rollout.external import ExternalEngine
from verlx.rollout.image_requests import image_prompt, sglang_image_data
from verlx.rollout.kernel_backends import inventory as kernel_inventory
from verlx.rollout.residency import WEIGHTS
from verlx.rollout.sglang_adapter import (
    SGLANG_CONTEXT_MARGIN,
    SGLangFeatures,
    build_server_args,
    graph_memory_env,
    megatron_core_importable,
    parse_sglang_outputs,
    server_arg_names,
    sglang_sampling_params,
)
from verlx.rollout.stream import Finished, StreamLimits
from verlx.rollout.task_stream import TaskStream
from verlx.rollout.tp_group import TensorParallelGroup
from verlx.rollout.weight_sync import (
    bucket_bytes_of,
    check_update_status,
    engine_dtype,
    iter_buckets,
    iter_engine_weights,
)
from verlx.utils.environ import scoped_environ
from verlx.utils.memory import ALLOC_CONF_ENV, alloc_conf_without_expandable_segments, set_expandable_segments

logger = logging.getLogger(__name__)
ENGINE = "sglang"
#: variables sglang.Engine() writes into the caller's environment; put back so the trainer keeps its own
_ENGINE_WRITES_ENV = ("NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE", "CUDA_DEVICE_MAX_CONNECTIONS")


def _node_ip() -> str:
    import ray

    if ray.is_initialized():
        return ray.util.get_node_ip_address()
    return socket.gethostbyname(socket.gethostname())


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _monkey_patch_torch_reductions() -> None:
    """SGLang's CUDA-IPC pickling fix (device by UUID); the module moved into sglang.srt.utils in 0.5.x."""
    try:
        from sglang.srt.utils.patch_torch import monkey_patch_torch_reductions
    except ImportError:
        from sglang.srt.patch_torch import monkey_patch_torch_reductions
    monkey_patch_torch_reductions()


def _local_serialized_tensor_class() -> type:
    """Where the class lives: model_runner_components.weight_updater (seen in 0.5.17 and 0.5.23), model_runner in
    older releases."""
    try:
        from sglang.srt.model_executor.model_runner_components.weight_updater import LocalSerializedTensor
    except ImportError:
        from sglang.srt.model_executor.model_runner import LocalSerializedTensor
    return LocalSerializedTensor


class SGLangRolloutEngine(ExternalEngine):
    name = "sglang"
    requires_package = "sglang"
    supports_partial_rollout = True
    supports_server = True  # rollout.server.enable: SGLang's HTTP server per replica (sglang_server.py)
    #: Qwen2-VL, Qwen2.5-VL, Qwen3-VL: image_data beside input_ids (rollout/image_requests.py)
    supports_image_input = True
    supports_server_image_input = True  # the server's /generate takes the same image_data, base64-encoded
    context_limit_override_env = "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"
    context_length_margin = SGLANG_CONTEXT_MARGIN

    @classmethod
    def checkpoint_problems(cls, config: dict) -> list[str]:
        """SGLang 0.5's Qwen2-VL vision tower reads vision_config.in_chans, which the hub's configs carry and a
        config that transformers 5 writes from scratch does not (it has in_channels): the scheduler dies on it."""
        vision = config.get("vision_config")
        if config.get("model_type") == "qwen2_vl" and isinstance(vision, dict) and "in_chans" not in vision:
            return ['has no "in_chans" in its vision_config, which SGLang\'s Qwen2-VL reads: add "in_chans": '
                    f'{vision.get("in_channels", 3)} beside "in_channels" (the hub\'s Qwen2-VL configs have both)']
        return []

    def __init__(self, ctx: RolloutContext):
        super().__init__(ctx)
        self.features = SGLangFeatures(self.version)
        self.tp = TensorParallelGroup.create(self.layout)

        from sglang.srt.server_args import ServerArgs

        field_names = server_arg_names(ServerArgs, self.features)
        # Level 1 keeps a CPU copy of the weights across release; level 2 (or a release without the option)
        # discards them, and the next generate needs a complete push.
        cpu_backup = self.config.sleep_level == 1 and "enable_weights_cpu_backup" in field_names
        self.residency.weights_survive_release = cpu_backup
        self._engine = None
        self._streams = itertools.count()
        self._start(field_names, cpu_backup)
        self._kv_stage_tags = self.tp.run_on_leader(self._non_weight_tags)
        self._session_open = False

    # ------------------------------------------------------------------ construction
    def _start(self, field_names: frozenset[str], cpu_backup: bool) -> None:
        """Place and start this group's engines; a failure on any rank of the group raises on all of them."""
        peers = self.tp.all_gather((_node_ip(), os.environ.get("CUDA_VISIBLE_DEVICES")))

        def start() -> None:
            visible, base_gpu_id = engine_visible_devices(self.layout, [devices for _, devices in peers])
            dist_init_addr = (
                _host_port(peers[0][0], self.layout.dist_init_port) if self.layout.needs_dist_init_addr else None
            )
            self.server_args = build_server_args(
                self.ctx,
                self.layout,
                field_names,
                base_gpu_id=base_gpu_id,
                dist_init_addr=dist_init_addr,
                weights_cpu_backup=cpu_backup,
                kernels=kernel_inventory(),
            )
            if self.layout.launches_engine:
                self._engine = self._launch(visible)

        self.tp.run_checked(start, "sglang engine start")

    def _launch(self, visible_devices: str | None):
        """sglang.Engine() with the environment its spawned processes need (the trainer's own is put back), or in
        server mode SGLang's HTTP server in a process of its own with that environment."""
        graph_env = graph_memory_env(self.server_args, megatron_core_importable())
        env: dict[str, str | None] = {**self.features.construction_env(), **graph_env}
        env["NCCL_NVLS_ENABLE"] = os.environ.get("NCCL_NVLS_ENABLE", "0")
        env[ALLOC_CONF_ENV] = alloc_conf_without_expandable_segments(os.environ.get(ALLOC_CONF_ENV))
        if visible_devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = visible_devices
        if self.config.server.enable:
            return self._launch_server(env)
        start_method = mp.get_start_method(allow_none=True)
        set_expandable_segments(False)
        try:
            with scoped_environ(env, restore=_ENGINE_WRITES_ENV):
                import sglang

                return sglang.Engine(**self.server_args)
        finally:
            mp.set_start_method(start_method, force=True)

    def _launch_server(self, env: dict[str, str | None]):
        from verlx.rollout.engine_server import server_environment, server_port
        from verlx.rollout.sglang_server import SGLangServer

        server = self.config.server
        self.server_args = {**self.server_args, "host": server.host, "port": server_port(self.layout, server.port)}
        client = SGLangServer.launch(self.server_args, server_environment(env), float(server.startup_timeout_s),
                                     self.ctx.rank, log_dir=server.log_dir, tp_size=self.layout.tp_size)
        logger.info("rollout rank %d: sglang server at %s (log %s)", self.ctx.rank, client.url, client.log_path)
        return client

    @property
    def server_url(self) -> str | None:
        """Where this replica's server answers (server mode, on the rank that started it), for an agent framework
        that sends its own requests during the rollout."""
        return self._engine.url if self.config.server.enable and self._engine is not None else None

    @staticmethod
    def _non_weight_tags() -> list[str]:
        """The engine's memory tags other than weights (KV cache, CUDA graphs): resumed after the weight push."""
        from sglang.srt.constants import GPU_MEMORY_ALL_TYPES

        return [t for t in GPU_MEMORY_ALL_TYPES if t != WEIGHTS]

    def shutdown(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    # ------------------------------------------------------------------ generation
    def drive(self, generation: Callable[[], T]) -> T:
        """The whole generation on the tensor-parallel leader, which holds the engine; its result on every peer."""
        return self.tp.run_on_leader(generation)

    def _open_stream(self, params: SamplingParams, partial: bool) -> SGLangStream:
        """An aborted request always comes back with its tokens (`partial` changes nothing)."""
        return SGLangStream(self._engine, params, self.stream_limits(), bool(self.config.calculate_log_probs),
                            f"verlx-{next(self._streams)}-", self.vision)

    # ------------------------------------------------------------------ memory
    def _release(self) -> None:
        """Release weights, KV cache and CUDA graphs (all tags), then give training expandable segments back."""
        self.tp.run_on_leader(lambda: self._engine.release_memory_occupation(tags=None))
        set_expandable_segments(True)

    def _resume(self, tag: str) -> None:
        """Weights alone; the KV cache together with the CUDA graphs."""
        set_expandable_segments(False)
        engine_tags = [WEIGHTS] if tag == WEIGHTS else self._kv_stage_tags
        self.tp.run_on_leader(lambda: self._engine.resume_memory_occupation(tags=engine_tags))

    # ------------------------------------------------------------------ weights
    def _load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Push HF-named tensors bucket by bucket inside one update session, then flush the radix cache.

        Every rank of the group calls this with the same parameters in the same order (full_tensor() of sharded
        parameters is collective); a bucket the engine rejects raises WeightSyncError on every rank.
        """
        set_expandable_segments(False)  # CUDA IPC cannot share tensors that live in expandable segments
        weights = iter_engine_weights(
            named_tensors, engine_dtype(self.config.dtype), self.tie_word_embeddings, device=self.ctx.device,
            rename=self.engine_weight_name)
        pushed: set[str] = set()
        self._begin_session()
        try:
            for bucket in iter_buckets(weights, bucket_bytes_of(self.config)):
                self._push_bucket(bucket)
                pushed.update(name for name, _ in bucket)
        finally:
            self._end_session()
        self._checked_call("flush_cache")
        return self._unset(pushed)

    def _checked_call(self, method: str) -> None:
        """Call an engine method on the leader; every rank raises unless it reports success (or returns nothing)."""
        self.tp.run_on_leader(
            lambda: check_update_status(getattr(self._engine, method)(), ENGINE, [f"<{method}>"], required=False)
        )

    def _begin_session(self) -> None:
        if self.features.weight_update_session:
            self._checked_call("begin_weight_update")
            self._session_open = True

    def _end_session(self) -> None:
        if self._session_open:
            self._session_open = False
            self._checked_call("end_weight_update")

    def _push_bucket(self, bucket: list[tuple[str, torch.Tensor]]) -> None:
        """One update_weights_from_tensor call; the bucket's tensors stay referenced until every rank knows the
        engine has returned (their CUDA-IPC handles must stay valid while SGLang opens them). On 0.5.21+ an update
        outside a session comes back as (False, message), which raises here like any other rejection."""
        names = [name for name, _ in bucket]
        _monkey_patch_torch_reductions()
        if self.layout.tp_size == 1:
            named = bucket
        else:
            from sglang.srt.utils import MultiprocessingSerializer

            own = [(name, MultiprocessingSerializer.serialize(tensor.detach())) for name, tensor in bucket]
            handles = self.tp.gather_to_leader(own)
            named = self._local_serialized(handles) if self.layout.is_leader else None

        def push():
            status = self._engine.update_weights_from_tensor(named_tensors=named, load_format=None, flush_cache=False)
            check_update_status(status, ENGINE, names)

        self.tp.run_on_leader(push)

    @staticmethod
    def _local_serialized(handles: list[list[tuple[str, bytes]]]) -> list:
        """Per-rank handle lists → [(name, LocalSerializedTensor(values=[handle of tp rank 0, 1, ...]))]."""
        LocalSerializedTensor = _local_serialized_tensor_class()
        names = [name for name, _ in handles[0]]
        for tp_rank, rank_handles in enumerate(handles):
            if [name for name, _ in rank_handles] != names:
                raise RuntimeError(
                    f"tensor-parallel rank {tp_rank} pushed {[n for n, _ in rank_handles][:4]}... while rank 0 pushed "
                    f"{names[:4]}...; every rank must iterate the same parameters in the same order"
                )
        return [
            (name, LocalSerializedTensor(values=[rank_handles[i][1] for rank_handles in handles]))
            for i, name in enumerate(names)
        ]


class SGLangStream(TaskStream):
    """Engine.async_generate per prompt (its samples as one request with n), a task on the engine's own event loop
    (its tokenizer manager is bound to it; the scheduler processes generate whatever this process does); an abort
    goes through TokenizerManager.abort_request: one abort_all when every request still running is cancelled (as
    veRL did), else one per request id."""

    def __init__(self, engine, params: SamplingParams, limits: StreamLimits, want_log_probs: bool, prefix: str,
                 vision: VisionLanguageModel | None = None):
        super().__init__(engine.loop, params, limits, want_log_probs, prefix)
        self.engine, self.vision = engine, vision

    def _request(self, request_ids, prompt_ids, params):
        key = request_ids[0].removeprefix(self.prefix)
        ids, images = image_prompt(prompt_ids, self.vision_inputs.get(key), self.images.get(key), self.vision)
        return self.engine.async_generate(input_ids=ids, sampling_params=sglang_sampling_params(params),
                                          return_logprob=self.want_log_probs,
                                          rid=request_ids if len(request_ids) > 1 else request_ids[0],
                                          image_data=sglang_image_data(images, len(request_ids)))

    def _finished(self, result, keys):
        return [Finished(key, sample.token_ids, sample.log_probs, sample.finish_reason, sample.detail)
                for key, sample in zip(keys, parse_sglang_outputs(result, len(keys), self.want_log_probs))]

    def _abort(self, request_ids, every_running):
        manager = self.engine.tokenizer_manager
        if every_running:
            manager.abort_request(abort_all=True)
        else:
            for request_id in request_ids:
                manager.abort_request(rid=request_id)
