"""The FSDP2 training engine: HF models sharded with `fully_shard`, Ulysses sequence parallelism, offload, DCP
checkpoints, and LoRA (whose reference is the same module with the adapters switched off)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.profiler import record_function

from verlx.batch_columns import MODEL_INPUTS, MULTI_MODAL_INPUTS, TEACHER_TOPK_IDS, TEACHER_TOPK_LOG_PROBS
from verlx.metrics.accumulator import MetricAccumulator
from verlx.models.lora import lora_scaling, merged_weights
from verlx.models.packing import HostCopy
from verlx.models.ulysses import check_ulysses, sequence_parallel_group
from verlx.models.vision import VisionLanguageModel, micro_batch_vision, vision_language_model
from verlx.protocol import DataProto
from verlx.rollout.weight_sync import gather_full, iter_engine_weights
from verlx.utils.dtypes import torch_dtype
from verlx.workers.engine import Head, LossFn, ModelSpec, Placement, TrainingEngine
from verlx.workers.fsdp.checkpoint import FSDPCheckpointManager
from verlx.workers.fsdp.model_builder import (
    apply_fsdp2,
    build_lr_scheduler,
    build_optimizer,
    compile_for_training,
    load_policy,
    load_value_model,
)
from verlx.workers.fsdp.offload import Offloader
from verlx.workers.guarded_step import GuardedStepper
from verlx.workers.micro_batching import MiniBatch, gradient_accumulation
from verlx.workers.profiling import MICRO_BATCH, OPTIMIZER_STEP
from verlx.workers.stats import optimizer_state_bytes


def host_mask_kwargs(mb: DataProto) -> dict:
    """The micro-batch's attention mask, while it is still on the host, for packing (no device-to-host copy back)."""
    mask = mb.batch["attention_mask"]
    return {"host_mask": HostCopy(mask)} if mask.device.type == "cpu" else {}


class FSDPEngine(TrainingEngine):
    """One FSDP2 module on this rank, with its optimizer, schedule, offloader and checkpoint manager when trainable.

    Built from a config with `build`; tests and benchmarks construct it around a module of their own."""

    def __init__(self, name: str, module: torch.nn.Module, optimizer=None, device=torch.device("cpu"), *,
                 grad_clip: float = 1.0, defer_grad_reduce: bool = False, max_consecutive_nonfinite: int = 3,
                 lr_scheduler=None, checkpoint: FSDPCheckpointManager | None = None, offloader: Offloader | None = None,
                 tied_embeddings: bool = False, lora: bool = False, adapters_disabled: bool = False,
                 vision: VisionLanguageModel | None = None):
        self.name, self.module, self.optimizer, self._device = name, module, optimizer, device
        self.grad_clip, self.defer_grad_reduce = grad_clip, defer_grad_reduce
        self.lr_scheduler, self.checkpoint, self.offloader = lr_scheduler, checkpoint, offloader
        self.tied_embeddings, self.lora, self.adapters_disabled = tied_embeddings, lora, adapters_disabled
        #: a vision-language policy: each micro-batch brings its rows' vision inputs (multi_modal_inputs)
        self.vision = vision
        self.stepper = GuardedStepper(name, max_consecutive_nonfinite)

    # ------------------------------------------------------------------ set-up
    @classmethod
    def place(cls, roles: dict, hf_config, world_size: int) -> Placement:
        """Ulysses: SP groups of consecutive ranks share one data shard; colocated roles need one SP size."""
        sizes = {key: role.ulysses_sequence_parallel_size for key, role in roles.items()}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"the actor and the reference share workers and need one Ulysses size, got {sizes}")
        sp = next(iter(sizes.values()), 1)
        if sp > 1:
            check_ulysses(hf_config, sp, world_size, f"{next(iter(sizes))}.ulysses_sequence_parallel_size")
        group, dp_rank, dp_size = sequence_parallel_group(sp)
        return Placement(dp_rank, dp_size, dist.get_rank() % sp == 0, group)

    @classmethod
    def build(cls, spec: ModelSpec, placement: Placement) -> FSDPEngine:
        # the critic keeps its FSDP settings in its model section
        fsdp = spec.role.fsdp_config if hasattr(spec.role, "fsdp_config") else spec.model.fsdp_config
        sp_group = placement.handle
        if spec.value_head:
            module = load_value_model(spec.path, spec.model, torch_dtype(fsdp.model_dtype), sp_group=sp_group)
        else:
            model_cfg = spec.model if spec.trainable else dataclasses.replace(spec.model,
                                                                              enable_gradient_checkpointing=False)
            module = load_policy(spec.path, model_cfg, torch_dtype(fsdp.model_dtype), sp_group=sp_group,
                                 with_lora=spec.lora,
                                 freeze_vision_tower=spec.trainable and spec.role.freeze_vision_tower)
        if not spec.trainable:
            module.requires_grad_(False)
        compile_for_training(module, spec.role.use_torch_compile, spec.device)
        if not spec.trainable:
            apply_fsdp2(module, spec.device, torch_dtype(fsdp.dtype), fsdp.reshard_after_forward)
            offloader = Offloader.for_config(spec.name, module, None, spec.device, fsdp.param_offload)
            return cls(spec.name, module, device=spec.device, offloader=offloader,
                       vision=vision_language_model(spec.hf_config))
        return cls._trainable(spec, module, fsdp, placement)

    @classmethod
    def _trainable(cls, spec: ModelSpec, module, fsdp, placement: Placement) -> FSDPEngine:
        sp_group = placement.handle
        apply_fsdp2(module, spec.device, torch_dtype(fsdp.dtype), fsdp.reshard_after_forward,
                    reduce_dtype=torch_dtype(fsdp.reduce_dtype),
                    cpu_offload=fsdp.offload_policy and spec.device.type == "cuda",
                    grad_divide_factor=placement.dp_size if sp_group is not None else None)
        optimizer = build_optimizer(module.parameters(), spec.role.optim)
        offloader = Offloader.for_config(spec.name, module, optimizer, spec.device,
                                         fsdp.param_offload and not fsdp.offload_policy, fsdp.optimizer_offload)
        lr_scheduler = build_lr_scheduler(optimizer, spec.role.optim, spec.total_steps)
        with_hf = spec.tokenizer is not None
        checkpoint = FSDPCheckpointManager(module, optimizer, lr_scheduler, spec.tokenizer,
                                           spec.hf_config if with_hf else None,
                                           strip_prefix="hf_model." if with_hf else "")
        return cls(spec.name, module, optimizer, spec.device, grad_clip=spec.role.grad_clip,
                   defer_grad_reduce=fsdp.defer_grad_reduce, max_consecutive_nonfinite=spec.max_consecutive_nonfinite,
                   lr_scheduler=lr_scheduler, checkpoint=checkpoint, offloader=offloader,
                   tied_embeddings=bool(getattr(spec.hf_config, "tie_word_embeddings", False)), lora=spec.lora,
                   vision=None if spec.value_head else vision_language_model(spec.hf_config))

    def reference_view(self) -> FSDPEngine:
        if not self.lora:
            return super().reference_view()
        return FSDPEngine("ref", self.module, device=self._device, offloader=self.offloader, adapters_disabled=True,
                          vision=self.vision)

    # ------------------------------------------------------------------ compute
    @property
    def device(self) -> torch.device:
        return self._device

    def _adapters(self):
        return self.module.hf_model.disable_adapter() if self.adapters_disabled else nullcontext()

    def _run(self, mb: DataProto, head: Head) -> dict:
        inputs = {k: mb.batch[k].to(self._device, non_blocking=True) for k in MODEL_INPUTS}
        response_length = mb.batch["responses"].shape[-1]
        extra = host_mask_kwargs(mb)
        if self.vision is not None:  # counted against the image tokens on the host, before the copy to the device
            extra["vision_inputs"] = micro_batch_vision(mb.non_tensor_batch.get(MULTI_MODAL_INPUTS),
                                                        mb.batch["input_ids"], self.vision, response_length)
        if head.kind == "values":
            return {"values": self.module(**inputs, response_length=response_length, **extra)}
        if head.kind == "response_hidden":
            extra["return_response_hidden"] = True
        names = ["log_prob", "entropy"]
        if head.kl_reference is not None:
            extra["kl_reference"] = head.kl_reference(mb)
            names.append("full_kl")
        if head.with_sum_pi_squared:
            extra["with_sum_pi_squared"] = True
            names.append("sum_pi_squared")
        if head.topk:
            extra["topk"] = head.topk
            names += ["topk_ids", "topk_log_probs"]
        if head.with_teacher_topk:
            extra["teacher_topk"] = (mb.batch[TEACHER_TOPK_IDS].to(self._device, non_blocking=True),
                                     mb.batch[TEACHER_TOPK_LOG_PROBS].to(self._device, non_blocking=True),
                                     head.topk_min_clamp)
            names += ["topk_kl", "topk_student_mass"]
        with self._adapters():
            out = self.module(**inputs, response_length=response_length, temperature=head.temperature,
                              chunk_size=head.chunk_size, with_entropy=head.with_entropy, **extra)
        if head.kind == "response_hidden":
            return {"response_hidden": out}
        return dict(zip(names, out))

    @torch.no_grad()
    def forward(self, parts: list[DataProto], head: Head) -> list[dict]:
        self.module.eval()
        return [self._run(mb, head) for mb in parts]

    def update(self, mini_batches: Iterable[MiniBatch], head: Head, loss_fn: LossFn,
               metrics: MetricAccumulator) -> dict[str, float]:
        self.module.train()
        for mini in mini_batches:
            self.optimizer.zero_grad(set_to_none=True)
            for mb in gradient_accumulation(self.module, mini.micro_batches, self.defer_grad_reduce):
                with record_function(MICRO_BATCH):  # markers for phase profiles (workers/profiling.py)
                    loss_fn(mb, self._run(mb, head), mini.counts).backward()
            with record_function(OPTIMIZER_STEP):
                self.stepper.step(self.module, self.optimizer, self.grad_clip, metrics)
        self.optimizer.zero_grad(set_to_none=True)  # gradients are dead weight until the next update (rollout)
        return metrics.reduce()

    # ------------------------------------------------------------------ state
    def on_device(self, optimizer: bool = False, overlap: bool = False):
        if self.offloader is None:
            return nullcontext()
        return self.offloader.on_device(optimizer=optimizer, overlap=overlap)

    def offload(self) -> None:
        if self.offloader is not None:
            self.offloader.offload()

    def lr(self) -> float:
        return self.lr_scheduler.get_last_lr()[0]

    def step_lr(self) -> None:
        self.lr_scheduler.step()

    def optimizer_state_bytes(self) -> int:
        return optimizer_state_bytes(self.optimizer)

    def save_checkpoint(self, path: str) -> None:
        self.checkpoint.save(path)

    def load_checkpoint(self, path: str) -> None:
        self.checkpoint.load(path)

    def rollout_weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        state = ((k.removeprefix("hf_model."), v) for k, v in self.module.state_dict().items())
        if self.lora:  # engines get plain HF weights with the adapters merged in
            state = merged_weights(gather_full(state), lora_scaling(self.module.hf_model))
        return iter_engine_weights(state, dtype, self.tied_embeddings, device=self._device)
