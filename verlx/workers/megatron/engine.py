"""The megatron-core training engine: GPT chunks built from HF weights with tensor, pipeline and context
parallelism, megatron DDP and optimizer, dist-checkpoints, and HF-named weight export for the rollout engine.

Importing this module does not import megatron-core (TRAINING_ENGINES imports it to check the strategy); `build`
and `place` do. TP/PP/CP peers of one data-parallel shard receive the same data, and only (tp 0, cp 0, last
pipeline stage) returns results. Megatron divides a returned loss by the number of micro-batches, so the engine
hands it the composed loss times that number.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

from verlx.metrics.accumulator import MetricAccumulator
from verlx.protocol import DataProto
from verlx.workers.engine import Head, LossFn, ModelSpec, Placement, TrainingEngine
from verlx.workers.megatron import require_megatron_core
from verlx.workers.micro_batching import MiniBatch


class MegatronEngine(TrainingEngine):
    """This rank's chunks of one model and the runner that drives megatron's schedules over them."""

    def __init__(self, runner, dims, layout, chunks: list, offloader, lr_scheduler=None, checkpoint=None):
        self.runner, self.dims, self.layout, self.chunks = runner, dims, layout, chunks
        self.lr_scheduler, self.checkpoint, self.offloader = lr_scheduler, checkpoint, offloader

    @classmethod
    def check_available(cls, key: str) -> None:
        require_megatron_core(key)

    @classmethod
    def place(cls, roles: dict, hf_config, world_size: int) -> Placement:
        """megatron's process groups for the layout of the first role (colocated roles must share it)."""
        require_megatron_core()
        from megatron.core import parallel_state as mpu

        from verlx.workers.megatron.architectures import model_dims
        from verlx.workers.megatron.setup import init_model_parallel, layout_for

        mcfg = next(iter(roles.values())).megatron
        layout = layout_for(mcfg, world_size, model_dims(hf_config))
        init_model_parallel(layout, mcfg.seed)
        is_collect = (mpu.get_tensor_model_parallel_rank() == 0 and mpu.get_context_parallel_rank() == 0
                      and mpu.is_pipeline_last_stage(ignore_virtual=True))
        return Placement(mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size(), is_collect, layout)

    @classmethod
    def build(cls, spec: ModelSpec, placement: Placement) -> MegatronEngine:
        require_megatron_core()
        from verlx.workers.megatron.architectures import model_dims
        from verlx.workers.megatron.checkpoint import MegatronCheckpointManager
        from verlx.workers.megatron.offload import MegatronOffloader
        from verlx.workers.megatron.runner import MegatronRunner
        from verlx.workers.megatron.setup import build_lr_scheduler, build_role_chunks, layout_for, wrap_for_training

        dims = model_dims(spec.hf_config)
        mcfg = spec.role.megatron
        layout = layout_for(mcfg, dist.get_world_size(), dims)
        recompute = spec.trainable and spec.model.enable_gradient_checkpointing
        chunks, config = build_role_chunks(dims, layout, mcfg, spec.path, recompute, value_head=spec.value_head)
        if not spec.trainable:
            for chunk in chunks:
                chunk.requires_grad_(False)
            offloader = MegatronOffloader.for_config(spec.name, chunks, None, spec.device, mcfg)
            return cls(MegatronRunner(chunks, spec.device, role=spec.name), dims, layout, chunks, offloader)
        wrapped, optimizer = wrap_for_training(chunks, config, mcfg, spec.role.optim, spec.role.grad_clip)
        key = {"actor": "actor_rollout_ref.actor", "critic": "critic"}.get(spec.name, spec.name)
        lr_scheduler = build_lr_scheduler(optimizer, spec.role.optim, spec.total_steps, f"{key}.optim")
        runner = MegatronRunner(wrapped, spec.device, optimizer, spec.name, spec.max_consecutive_nonfinite)
        with_hf = spec.tokenizer is not None
        checkpoint = MegatronCheckpointManager(wrapped, optimizer, lr_scheduler, spec.tokenizer,
                                               spec.hf_config if with_hf else None)
        offloader = MegatronOffloader.for_config(spec.name, wrapped, optimizer, spec.device, mcfg)
        return cls(runner, dims, layout, chunks, offloader, lr_scheduler, checkpoint)

    # ------------------------------------------------------------------ compute
    @property
    def device(self) -> torch.device:
        return self.runner.device

    def _head(self, head: Head, chunk, hidden: torch.Tensor, aligned) -> dict:
        if head.kind == "values":
            return {"values": chunk.values(hidden, aligned)}
        if head.kind != "log_probs" or head.kl_reference is not None:
            raise NotImplementedError("the exact KL (actor.kl_loss_type=full or algorithm.kl_penalty=full) needs the "
                                      "fsdp strategy; the megatron engine computes KLs from sampled tokens only")
        if head.topk or head.with_teacher_topk:
            raise NotImplementedError("top-k distillation (distillation.distillation_loss.loss_mode=forward_kl_topk) "
                                      "needs the fsdp strategy")
        log_prob, entropy = chunk.log_probs(hidden, aligned, head.temperature, head.chunk_size, head.with_entropy)
        out = {"log_prob": log_prob, "entropy": entropy}
        if head.with_sum_pi_squared:
            out["sum_pi_squared"] = chunk.sum_pi_squared(hidden, aligned, head.temperature, head.chunk_size)
        return out

    @torch.no_grad()
    def forward(self, parts: list[DataProto], head: Head) -> list[dict] | None:
        def loss_func(item, chunk, hidden):
            return torch.zeros((), device=hidden.device), self._head(head, chunk, hidden, item.aligned)

        outputs = self.runner.run(self.runner.prepare(parts), loss_func, forward_only=True)
        return outputs if self.runner.is_last_stage else None

    def update(self, mini_batches: Iterable[MiniBatch], head: Head, loss_fn: LossFn,
               metrics: MetricAccumulator) -> dict[str, float]:
        for mini in mini_batches:
            self._train_mini_batch(mini, head, loss_fn, metrics)
        return self.runner.reduce_metrics(metrics)

    def _train_mini_batch(self, mini: MiniBatch, head: Head, loss_fn: LossFn, metrics: MetricAccumulator) -> None:
        micro = self.runner.prepare(mini.micro_batches)

        def loss_func(item, chunk, hidden):
            outputs = self._head(head, chunk, hidden, item.aligned)
            return loss_fn(item.data, outputs, mini.counts) * len(micro), {}

        self.runner.zero_grad()
        self.runner.run(micro, loss_func, forward_only=False)
        self.runner.step(metrics)

    # ------------------------------------------------------------------ state
    def on_device(self, optimizer: bool = False, overlap: bool = False):
        return self.offloader.on_device(optimizer=optimizer, overlap=overlap)

    def offload(self) -> None:
        self.offloader.offload()

    def lr(self) -> float:
        return self.lr_scheduler.get_last_lr()[0]

    def step_lr(self) -> None:
        self.lr_scheduler.step()

    def optimizer_state_bytes(self) -> int:
        from verlx.workers.stats import optimizer_state_bytes

        return optimizer_state_bytes(self.runner.optimizer)

    def save_checkpoint(self, path: str) -> None:
        self.checkpoint.save(path)

    def load_checkpoint(self, path: str) -> None:
        self.checkpoint.load(path)

    def rollout_weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """HF-named full tensors from the TP/PP/EP shards: the owning ranks gather over (expert-)TP, then broadcast
        over EP and PP."""
        from megatron.core import parallel_state as mpu

        from verlx.rollout.weight_sync import iter_engine_weights
        from verlx.workers.megatron.export_plan import ExportGroups, export_plan, iter_hf_weights
        from verlx.workers.megatron.model import local_params

        groups = ExportGroups(mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_group(),
                              mpu.get_pipeline_model_parallel_group(), mpu.get_expert_model_parallel_rank(),
                              mpu.get_expert_tensor_parallel_group(), mpu.get_expert_model_parallel_group())
        named = iter_hf_weights(export_plan(self.dims, self.layout), self.dims, local_params(self.chunks), groups,
                                dtype, self.device)
        return iter_engine_weights(named, None, self.dims.tie_word_embeddings)
