"""The training-engine interface: one model (policy, reference or value) of one worker process on one backend.

The actor/rollout/ref worker and the critic worker own one engine per model and never look at the backend. An
engine builds its model, runs forward passes and mini-batch updates whose loss the backend-independent code
composes (workers/actor.py, workers/critic.py), moves its state on and off the device, writes checkpoints, and
streams full HF-named weights to a rollout engine. Engines are looked up by the role's `strategy` key in
TRAINING_ENGINES; entries are 'module:Class' strings, so choosing fsdp never imports megatron-core.

Adding a backend: subclass TrainingEngine (place, build and the abstract methods), then
`TRAINING_ENGINES.register_lazy("name", "package.module:Class")`.
"""

from __future__ import annotations

import abc
from collections.abc import Callable, Iterable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from verlx.metrics.accumulator import MetricAccumulator
from verlx.protocol import DataProto
from verlx.utils.registry import Registry
from verlx.workers.micro_batching import MiniBatch


@dataclass(frozen=True)
class Head:
    """What a forward pass computes at the response positions of each micro-batch.

    kind "log_probs": {"log_prob", "entropy" (None unless with_entropy)}, plus "full_kl" (exact KL to the model
    whose response hidden states `kl_reference(micro_batch)` returns), "sum_pi_squared" (sum_v pi_v^2 per token,
    forward only, with with_sum_pi_squared), "topk_ids" and "topk_log_probs" ([B, R, topk], a distillation
    teacher's, forward only, with topk > 0) and "topk_kl" and "topk_student_mass" (the forward KL over the
    micro-batch's teacher_topk_ids / teacher_topk_log_probs, with with_teacher_topk; log-probs clamped below at
    topk_min_clamp when set); "values": {"values"} (unmasked);
    "response_hidden": {"response_hidden": (hidden states [B, R, H], output weight)}, another model's kl_reference.
    """

    kind: str = "log_probs"
    temperature: float = 1.0
    with_entropy: bool = False
    chunk_size: int = 4096
    kl_reference: Callable[[DataProto], Any] | None = None
    with_sum_pi_squared: bool = False
    topk: int = 0
    with_teacher_topk: bool = False
    topk_min_clamp: float | None = None


@dataclass(frozen=True)
class Placement:
    """This process's place in the data-parallel layout of a worker's models (one per worker: colocated models
    share it). `handle` is the backend's own: the Ulysses group (fsdp), the ParallelLayout (megatron)."""

    dp_rank: int
    dp_size: int
    is_collect: bool  # returns results (one rank per data-parallel shard)
    handle: Any = None


@dataclass
class ModelSpec:
    """Everything an engine needs to build one model; `role` and `model` are the config sections of the role
    (ActorConfig, RefConfig or CriticConfig) and of its model."""

    name: str  # actor | ref | critic: metric prefix and log name
    path: str  # the expanded model directory
    model: Any
    role: Any
    hf_config: Any
    device: torch.device
    value_head: bool = False
    trainable: bool = True
    total_steps: int = 1
    max_consecutive_nonfinite: int = 3
    lora: bool = False
    tokenizer: Any = None  # saved with the HF config into checkpoints (the actor's, for export); None: neither


# loss_fn(micro_batch, head outputs, mini-batch counts) -> this micro-batch's share of the mini-batch loss
LossFn = Callable[[DataProto, dict, dict], torch.Tensor]


class TrainingEngine(abc.ABC):
    """One model on one backend; see the module docstring."""

    # ------------------------------------------------------------------ set-up
    @classmethod
    def check_available(cls, key: str) -> None:
        """Raise, naming `key` and the install command, when the backend's packages are missing."""

    @classmethod
    @abc.abstractmethod
    def place(cls, roles: dict[str, Any], hf_config, world_size: int) -> Placement:
        """Set up the process's parallel layout for the colocated `roles` (config key → role config), once per
        worker; collective."""

    @classmethod
    @abc.abstractmethod
    def build(cls, spec: ModelSpec, placement: Placement) -> TrainingEngine:
        """Load the model (and, when trainable, its optimizer, schedule and checkpoint manager)."""

    def reference_view(self) -> TrainingEngine:
        """This engine's model with its LoRA adapters switched off: the reference of a LoRA actor."""
        raise NotImplementedError(f"{type(self).__name__} has no LoRA reference (model.lora_rank > 0 needs fsdp)")

    # ------------------------------------------------------------------ compute
    @property
    @abc.abstractmethod
    def device(self) -> torch.device: ...

    @abc.abstractmethod
    def forward(self, parts: list[DataProto], head: Head) -> list[dict] | None:
        """Forward only, without gradients: `head`'s outputs of every micro-batch, in order; None on ranks that
        return nothing (megatron's pipeline stages but the last)."""

    @abc.abstractmethod
    def update(self, mini_batches: Iterable[MiniBatch], head: Head, loss_fn: LossFn,
               metrics: MetricAccumulator) -> dict[str, float]:
        """One guarded optimizer step per mini-batch (forward and backward of every micro-batch with `loss_fn`);
        returns `metrics` reduced over the data-parallel ranks."""

    # ------------------------------------------------------------------ state
    def on_device(self, optimizer: bool = False, overlap: bool = False):
        """Context: offloaded parameters (and, with `optimizer`, optimizer state) on the device for a phase; with
        `overlap` (phases whose first use is a forward pass), the copies may still run when the block starts."""
        return nullcontext()

    def offload(self) -> None:
        """Move what the config offloads off the device (end of set-up)."""

    @abc.abstractmethod
    def lr(self) -> float:
        """The learning rate of the next optimizer step."""

    @abc.abstractmethod
    def step_lr(self) -> None:
        """Advance the learning-rate schedule by one training step."""

    @abc.abstractmethod
    def optimizer_state_bytes(self) -> int: ...

    @abc.abstractmethod
    def save_checkpoint(self, path: str) -> None: ...

    @abc.abstractmethod
    def load_checkpoint(self, path: str) -> None: ...

    @abc.abstractmethod
    def rollout_weights(self, dtype: torch.dtype) -> Iterator[tuple[str, torch.Tensor]]:
        """Full HF-named tensors in `dtype` on this device, the tied lm_head left out, in the same order on every
        rank (collective), for RolloutEngine.update_weights."""


TRAINING_ENGINES: Registry[type[TrainingEngine]] = Registry("training engine", "actor_rollout_ref.actor.strategy")
TRAINING_ENGINES.register_lazy("fsdp", "verlx.workers.fsdp.engine:FSDPEngine")
TRAINING_ENGINES.register_lazy("fsdp2", "verlx.workers.fsdp.engine:FSDPEngine")
TRAINING_ENGINES.register_lazy("megatron", "verlx.workers.megatron.engine:MegatronEngine")


def engine_class(strategy: str, key: str = "actor_rollout_ref.actor.strategy") -> type[TrainingEngine]:
    """The engine class of `strategy`, checked to be runnable here (`key` is named when it is not)."""
    cls = TRAINING_ENGINES.get(strategy)
    cls.check_available(key)
    return cls
