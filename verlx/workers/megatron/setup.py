"""Bringing up megatron for one process: parallel groups, model chunks from HF weights, DDP, optimizer, schedule."""

from __future__ import annotations

import logging

import torch

from verlx.utils.lr_schedules import optim_lr_multiplier
from verlx.workers.megatron import require_megatron_core, transformer_engine_available
from verlx.workers.megatron.architectures import ModelDims
from verlx.workers.megatron.overrides import stage_layer_overrides
from verlx.workers.megatron.parallel import ParallelLayout, require_layout
from verlx.workers.megatron.schedule import scheduler_kwargs

logger = logging.getLogger(__name__)


def layout_for(mcfg, world_size: int, dims: ModelDims) -> ParallelLayout:
    """The role's layout; the expert sizes apply to mixture-of-experts models only (dense ones ignore them)."""
    experts = dict(ep=mcfg.expert_model_parallel_size, etp=mcfg.expert_tensor_parallel_size) if dims.is_moe else {}
    return require_layout(world_size, mcfg.tensor_model_parallel_size, mcfg.pipeline_model_parallel_size,
                          mcfg.context_parallel_size, mcfg.virtual_pipeline_model_parallel_size, **experts,
                          **stage_layer_overrides(mcfg.override_transformer_config),
                          num_heads=dims.num_heads, num_kv_heads=dims.num_kv_heads, num_layers=dims.num_layers)


def init_model_parallel(layout: ParallelLayout, seed: int) -> None:
    """megatron's process groups are per process: colocated roles must agree on one layout."""
    require_megatron_core()
    from megatron.core import parallel_state as mpu

    if mpu.model_parallel_is_initialized():
        current = (mpu.get_tensor_model_parallel_world_size(), mpu.get_pipeline_model_parallel_world_size(),
                   mpu.get_context_parallel_world_size(), mpu.get_expert_model_parallel_world_size(),
                   mpu.get_expert_tensor_parallel_world_size())
        wanted = (layout.tp, layout.pp, layout.cp, layout.ep, layout.expert_tp)
        if current != wanted:
            raise ValueError(f"megatron is already initialised with (tp, pp, cp, ep, etp)={current} in this process; "
                             f"colocated roles must use the same layout, got {wanted}")
        return
    mpu.initialize_model_parallel(
        tensor_model_parallel_size=layout.tp,
        pipeline_model_parallel_size=layout.pp,
        virtual_pipeline_model_parallel_size=layout.vpp,
        context_parallel_size=layout.cp,
        expert_model_parallel_size=layout.ep,
        expert_tensor_parallel_size=layout.expert_tp,
    )
    if torch.cuda.is_available():
        from megatron.core import tensor_parallel

        tensor_parallel.model_parallel_cuda_manual_seed(seed)


def resolve_transformer_engine(setting: str) -> bool:
    """auto: use transformer-engine when installed; true: require it; false: local layers."""
    setting = str(setting).lower()
    if setting in ("auto", ""):
        return transformer_engine_available()
    if setting in ("true", "1", "yes"):
        if not transformer_engine_available():
            raise ImportError("megatron.use_transformer_engine=true but transformer-engine is not installed; "
                              "install it or set use_transformer_engine=auto")
        return True
    if setting in ("false", "0", "no"):
        return False
    raise ValueError(f"megatron.use_transformer_engine={setting!r}; use auto, true or false")


def build_role_chunks(dims: ModelDims, layout: ParallelLayout, mcfg, model_path: str, recompute: bool,
                      value_head: bool):
    """This rank's chunks with their initial weights (the HF model's, or a dist-checkpoint's with
    use_dist_checkpointing), and their TransformerConfig (one per role: it carries hooks)."""
    from verlx.workers.megatron.checkpoint import load_dist_weights
    from verlx.workers.megatron.model import HFCheckpoint, build_chunks, build_transformer_config, load_hf_weights

    use_te = resolve_transformer_engine(mcfg.use_transformer_engine)
    config = build_transformer_config(dims, layout, mcfg, recompute, use_te, on_cpu=not torch.cuda.is_available())
    chunks = build_chunks(dims, layout, config, use_te, value_head)
    if mcfg.use_dist_checkpointing:
        load_dist_weights(chunks, mcfg.dist_checkpointing_path)
    else:
        load_hf_weights(chunks, HFCheckpoint(model_path), dims, layout)
    return chunks, config


def wrap_for_training(chunks, config, mcfg, optim_cfg, grad_clip: float):
    """Megatron DDP around each chunk, the (distributed) optimizer, and the hooks the schedule calls."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    ddp_config = DistributedDataParallelConfig(**{
        "grad_reduce_in_fp32": True, "overlap_grad_reduce": False, **mcfg.override_ddp_config,
        "use_distributed_optimizer": mcfg.use_distributed_optimizer})
    wrapped = [DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
               for i, chunk in enumerate(chunks)]
    optimizer = get_megatron_optimizer(
        OptimizerConfig(**{
            "optimizer": "adam", "lr": optim_cfg.lr, "min_lr": optim_cfg.min_lr,
            "weight_decay": optim_cfg.weight_decay, "adam_beta1": optim_cfg.betas[0],
            "adam_beta2": optim_cfg.betas[1], "bf16": config.bf16, "fp16": config.fp16,
            "params_dtype": config.params_dtype, "clip_grad": grad_clip, **optim_cfg.override_optimizer_config,
            "use_distributed_optimizer": mcfg.use_distributed_optimizer}),
        wrapped,
    )
    config.finalize_model_grads_func = finalize_model_grads
    config.no_sync_func = [w.no_sync for w in wrapped] if len(wrapped) > 1 else wrapped[0].no_sync
    return wrapped, optimizer


def build_lr_scheduler(optimizer, optim_cfg, total_steps: int, key: str):
    """megatron-core's OptimizerParamScheduler when optim.lr_decay_style is set (veRL's megatron keys), else the
    optim section's lr_scheduler_type schedule (the FSDP backend's)."""
    if optim_cfg.lr_decay_style is None:
        return FactorLRScheduler(optimizer, optim_cfg, total_steps)
    return MegatronParamScheduler(optimizer, scheduler_kwargs(key, optim_cfg, total_steps))


class MegatronParamScheduler:
    """megatron-core's parameter scheduler (lr and weight decay of every parameter group) behind the engine's
    scheduler interface; its state (steps taken) goes into the checkpoint's extra_rank files."""

    def __init__(self, optimizer, kwargs: dict):
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

        self.optimizer = optimizer
        self.scheduler = OptimizerParamScheduler(optimizer, **kwargs)

    def get_last_lr(self) -> list[float]:
        return [self.scheduler.get_lr(self.optimizer.param_groups[0])]

    def step(self) -> None:
        self.scheduler.step(1)

    def state_dict(self) -> dict:
        return self.scheduler.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.scheduler.load_state_dict(state)


class FactorLRScheduler:
    """The optim section's schedule (verlx.utils.lr_schedules) applied to a megatron optimizer's parameter groups."""

    def __init__(self, optimizer, optim_cfg, total_steps: int):
        self.optimizer = optimizer
        self.base_lr = optim_cfg.lr
        self.factor = optim_lr_multiplier(optim_cfg, total_steps)
        self.last_step = 0
        self._apply()

    def _apply(self) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = self.base_lr * self.factor(self.last_step)

    def get_last_lr(self) -> list[float]:
        return [self.base_lr * self.factor(self.last_step)]

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def state_dict(self) -> dict:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict) -> None:
        self.last_step = state["last_step"]
        self._apply()
