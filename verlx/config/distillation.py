"""Typed config of veRL's on-policy distillation keys (distillation/distillation.yaml): the loss settings verlx
uses, and the teacher's pool and inference-server settings, which it reads and does not use (its teacher is a
frozen FSDP model in the training workers)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verlx.config.roles import ClipRange


@dataclass
class DistillationLossConfig(ClipRange):
    loss_mode: str = "k3"
    topk: int | None = 32
    use_task_rewards: bool = True
    distillation_loss_coef: float = 1.0
    loss_max_clamp: float | None = None
    log_prob_min_clamp: float | None = None
    use_policy_gradient: bool = False
    policy_loss_mode: str = "vanilla"
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = 0.2
    clip_ratio_high: float | None = 0.2

    @property
    def clip_ratio_c(self) -> float:
        """veRL's distillation section has no dual-clip key; its vanilla loss falls back to 3.0."""
        return 3.0


@dataclass
class TeacherInferenceConfig:
    name: str = "auto"
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5
    enforce_eager: bool = True
    cudagraph_capture_sizes: list[int] | None = None
    free_cache_engine: bool = True
    data_parallel_size: int = 1
    expert_parallel_size: int = 1
    tensor_model_parallel_size: int = 2
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    max_num_seqs: int = 1024
    load_format: str = "auto"
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    limit_images: int | None = None
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    disable_log_stats: bool = True
    skip_tokenizer_init: bool = True
    prompt_length: int = 512
    response_length: int = 512
    temperature: float = 1.0


@dataclass
class TeacherModelConfig:
    key: str | None = None
    model_path: str | None = None
    num_replicas: int | None = 0
    inference: TeacherInferenceConfig = field(default_factory=TeacherInferenceConfig)


DEFAULT_TEACHER = "teacher_model"


def _one_teacher() -> dict[str, TeacherModelConfig]:
    return {DEFAULT_TEACHER: TeacherModelConfig()}


@dataclass
class DistillationConfig:
    enabled: bool = False
    distillation_loss: DistillationLossConfig = field(default_factory=DistillationLossConfig)
    n_gpus_per_node: int = 8
    nnodes: int = 0
    teacher_models: dict[str, TeacherModelConfig] = field(default_factory=_one_teacher)
    teacher_key: str = "data_source"

    @property
    def teachers(self) -> dict[str, TeacherModelConfig]:
        """The teachers by entry name as veRL resolves the section: the default entry `teacher_model` is dropped once
        other entries are added (`+distillation.teacher_models.NAME.*`), so one added entry is the single teacher."""
        if len(self.teacher_models) > 1:
            return {name: t for name, t in self.teacher_models.items() if name != DEFAULT_TEACHER}
        return dict(self.teacher_models)

    @property
    def teacher_name(self) -> str:
        """The entry name of the one teacher verlx runs (several are refused before Ray)."""
        return next(iter(self.teachers))

    @property
    def teacher(self) -> TeacherModelConfig:
        return self.teachers[self.teacher_name]

    @property
    def teacher_key_prefix(self) -> str:
        """The config path of the teacher's entry, for messages."""
        return f"distillation.teacher_models.{self.teacher_name}"
