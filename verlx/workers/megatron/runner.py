"""Running micro-batches through megatron's pipeline schedules, and the guarded optimizer step.

Gradients are averaged over data-parallel ranks by megatron's DDP, the same contract as FSDP.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from verlx.metrics.accumulator import MetricAccumulator
from verlx.protocol import DataProto
from verlx.workers.guarded_step import NonFiniteUpdates
from verlx.workers.megatron.batch_layout import AlignedBatch, align_batch


@dataclass
class MicroBatch:
    data: DataProto  # the rows (on CPU) for the loss
    aligned: AlignedBatch  # model inputs on the device


def _unwrap(model):
    return getattr(model, "module", model)


class MegatronRunner:
    """This rank's model chunks (DDP-wrapped when trainable) and the schedule that runs them."""

    def __init__(self, chunks: list, device: torch.device, optimizer=None, role: str = "actor",
                 max_consecutive_nonfinite: int = 3):
        self.chunks = chunks
        self.device = device
        self.optimizer = optimizer
        self.role = role
        self.max_consecutive = max_consecutive_nonfinite
        self.consecutive = 0
        self.config = _unwrap(chunks[0]).config
        self.seq_multiple = mpu.get_tensor_model_parallel_world_size() if self.config.sequence_parallel else 1

    @property
    def is_last_stage(self) -> bool:
        return mpu.is_pipeline_last_stage(ignore_virtual=True)

    def prepare(self, parts: list[DataProto]) -> list[MicroBatch]:
        out = []
        for mb in parts:
            aligned = align_batch(mb.batch["input_ids"], mb.batch["attention_mask"], mb.batch["responses"].shape[-1],
                                  self.seq_multiple)
            out.append(MicroBatch(mb, aligned.to(self.device)))
        return out

    def run(self, micro: list[MicroBatch], loss_func, forward_only: bool) -> list:
        """One pass of the schedule over `micro`; on the last stage the list of what loss_func returned."""
        pp = mpu.get_pipeline_model_parallel_world_size()
        if len(self.chunks) > 1 and len(micro) % pp:
            raise ValueError(f"the interleaved pipeline schedule needs a multiple of pipeline_model_parallel_size="
                             f"{pp} micro-batches, got {len(micro)}; change the micro-batch size")

        def forward_step(data_iterator, model):
            item = next(data_iterator)
            hidden = model(item.aligned.input_ids)
            return hidden, functools.partial(loss_func, item, _unwrap(model))

        iterators = [iter(micro) for _ in self.chunks]
        for chunk in self.chunks:
            chunk.train(not forward_only)
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iterators if len(self.chunks) > 1 else iterators[0],
            model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
            num_microbatches=len(micro),
            seq_length=max(m.aligned.input_ids.shape[1] for m in micro),
            micro_batch_size=max(len(m.data) for m in micro),
            forward_only=forward_only,
        )

    # ------------------------------------------------------------------ optimizer step
    def zero_grad(self) -> None:
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _grads_finite(self) -> bool:
        """One flag for every rank: a non-finite gradient anywhere skips the step everywhere (one host sync)."""
        sums = [buf.grad_data.float().sum() for chunk in self.chunks for buf in getattr(chunk, "buffers", [])]
        local = torch.stack(sums).sum() if sums else torch.zeros((), device=self.device)
        bad = (~torch.isfinite(local)).float().reshape(1)
        if dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return bad.item() == 0

    def step(self, metrics: MetricAccumulator) -> None:
        if self._grads_finite():
            ok, grad_norm, _ = self.optimizer.step()
            self.consecutive = 0
            if grad_norm is not None:  # a Python float (megatron reads it to the host for clipping)
                metrics.add_mean(f"{self.role}/grad_norm", grad_norm)
        else:
            self.zero_grad()
            self.consecutive += 1
            metrics.add_count(f"{self.role}/nonfinite_updates_skipped")
            if self.consecutive >= self.max_consecutive:
                raise NonFiniteUpdates(
                    f"{self.consecutive} consecutive {self.role} updates had a non-finite gradient; stopping as "
                    "trainer.max_consecutive_nonfinite_updates says"
                )
        metrics.end_step()

    def reduce_metrics(self, metrics: MetricAccumulator) -> dict[str, float]:
        """Metrics live on the last pipeline stage; they are averaged over its data-parallel group."""
        if not self.is_last_stage:
            return {}
        return metrics.reduce(group=mpu.get_data_parallel_group())
