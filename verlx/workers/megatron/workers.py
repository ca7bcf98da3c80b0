"""Megatron-backed worker roles with the FSDP workers' interface (methods, dispatch modes, DataProto keys).

They subclass the FSDP workers and replace what is backend-specific: building the models, pushing weights to
the engine, and the data-parallel layout. TP/PP/CP peers declare the same dp rank on the default mesh and only
(tp 0, cp 0, last pipeline stage) returns results, so the driver sees one result per data-parallel shard.
"""

from __future__ import annotations

import time

import torch

from verlx.single_controller import Dispatch, register
from verlx.single_controller.decorator import DEFAULT_MESH
from verlx.utils.distributed import init_distributed
from verlx.utils.seeding import seed_everything
from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
from verlx.workers.critic_worker import CriticWorker
from verlx.utils.dtypes import torch_dtype
from verlx.workers.fsdp.model_builder import expand_path, load_hf_config
from verlx.workers.megatron import require_megatron_core
from verlx.workers.megatron.architectures import model_dims


def _declare_data_parallel(worker) -> None:
    from megatron.core import parallel_state as mpu

    is_collect = (mpu.get_tensor_model_parallel_rank() == 0 and mpu.get_context_parallel_rank() == 0
                  and mpu.is_pipeline_last_stage(ignore_virtual=True))
    for mesh in (DEFAULT_MESH, "actor", "critic"):  # the FSDP workers' methods dispatch by role mesh
        worker.set_dispatch_info(mesh, mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size(), is_collect)


class MegatronActorRolloutRefWorker(ActorRolloutRefWorker):
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        from verlx.workers.megatron.checkpoint import MegatronCheckpointManager
        from verlx.workers.megatron.engine import MegatronPPOActor, MegatronRunner
        from verlx.workers.megatron.export_plan import export_plan
        from verlx.workers.megatron.setup import (
            FactorLRScheduler,
            build_role_chunks,
            init_model_parallel,
            layout_for,
            wrap_for_training,
        )

        require_megatron_core()
        cfg = self.config
        arr = cfg.actor_rollout_ref
        model_path = self._init_process_and_model_metadata()
        self.dims = model_dims(self.hf_config)
        mcfg = arr.actor.megatron
        self.layout = layout_for(mcfg, self.world_size, self.dims)
        init_model_parallel(self.layout, mcfg.seed)
        limit = cfg.trainer.max_consecutive_nonfinite_updates
        if self.is_actor:
            chunks, config = build_role_chunks(self.dims, self.layout, mcfg, model_path,
                                               arr.model.enable_gradient_checkpointing, value_head=False)
            wrapped, optimizer = wrap_for_training(chunks, config, mcfg, arr.actor.optim, arr.actor.grad_clip)
            self.lr_scheduler = FactorLRScheduler(optimizer, arr.actor.optim, cfg.trainer.total_training_steps or 1)
            runner = MegatronRunner(wrapped, self.device, optimizer, "actor", limit)
            self.actor = MegatronPPOActor(arr.actor, runner)
            self.actor_chunks = chunks
            self.checkpoint = MegatronCheckpointManager(wrapped, optimizer, self.lr_scheduler, self.tokenizer,
                                                        self.hf_config)
            self.export_plan = export_plan(self.dims, self.layout)
        if self.is_ref:
            ref_chunks, _ = build_role_chunks(self.dims, layout_for(arr.ref.megatron, self.world_size, self.dims),
                                              arr.ref.megatron, model_path, recompute=False, value_head=False)
            for chunk in ref_chunks:
                chunk.requires_grad_(False)
            self.ref = MegatronPPOActor(arr.actor, MegatronRunner(ref_chunks, self.device, role="ref"))
        _declare_data_parallel(self)
        if self.is_rollout:
            self._init_engine(model_path)
        return {"rank": self.rank, "device": str(self.device), "layout": self.layout.coords(self.rank)}

    def _dp_size(self) -> int:
        return self.layout.dp

    def _push_weights(self) -> float:
        """Stream HF-named full tensors from the TP/PP shards into the engine as one push (the engine buckets)."""
        from megatron.core import parallel_state as mpu

        from verlx.rollout.weight_sync import iter_engine_weights
        from verlx.workers.megatron.export_plan import iter_hf_weights
        from verlx.workers.megatron.model import local_params

        start = time.perf_counter()
        rollout = self.config.actor_rollout_ref.rollout
        dtype = torch_dtype(rollout.dtype) if self.device.type == "cuda" else torch.float32
        named = iter_hf_weights(self.export_plan, self.dims, local_params(self.actor_chunks),
                                mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_group(),
                                mpu.get_pipeline_model_parallel_group(), dtype, self.device)
        self.engine.update_weights(iter_engine_weights(named, None, self.dims.tie_word_embeddings))
        self.engine_weights_stale = False
        return time.perf_counter() - start


class MegatronCriticWorker(CriticWorker):
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        from verlx.workers.megatron.checkpoint import MegatronCheckpointManager
        from verlx.workers.megatron.engine import MegatronPPOCritic, MegatronRunner
        from verlx.workers.megatron.setup import (
            FactorLRScheduler,
            build_role_chunks,
            init_model_parallel,
            layout_for,
            wrap_for_training,
        )

        require_megatron_core("critic.strategy")
        cfg = self.config
        critic = cfg.critic
        init_distributed(timeout_s=cfg.actor_rollout_ref.nccl_timeout)
        seed_everything(cfg.trainer.seed + 1000 + self.rank)
        path = expand_path(critic.model.path or cfg.actor_rollout_ref.model.path)
        hf_config = load_hf_config(path, critic.model.trust_remote_code, critic.model.override_config)
        dims = model_dims(hf_config)
        self.layout = layout_for(critic.megatron, self.world_size, dims)
        init_model_parallel(self.layout, critic.megatron.seed)
        chunks, config = build_role_chunks(dims, self.layout, critic.megatron, path,
                                           critic.model.enable_gradient_checkpointing, value_head=True)
        wrapped, optimizer = wrap_for_training(chunks, config, critic.megatron, critic.optim, critic.grad_clip)
        self.lr_scheduler = FactorLRScheduler(optimizer, critic.optim, cfg.trainer.total_training_steps or 1)
        runner = MegatronRunner(wrapped, self.device, optimizer, "critic", cfg.trainer.max_consecutive_nonfinite_updates)
        self.critic = MegatronPPOCritic(critic, runner)
        self.checkpoint = MegatronCheckpointManager(wrapped, optimizer, self.lr_scheduler)
        _declare_data_parallel(self)

    def _dp(self) -> int:
        return self.layout.dp
