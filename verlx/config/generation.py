"""Typed config of `python -m verlx.trainer.main_generation` (generation.yaml; keys follow veRL's generation.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verlx.config.roles import RolloutConfig
from verlx.config.run import RayKwargsConfig


@dataclass
class GenerationDataConfig:
    path: str | list[str] = "~/data/gsm8k/test.parquet"
    prompt_key: str = "prompt"
    n_samples: int = 1
    output_path: str | None = None
    batch_size: int = 128
    max_samples: int = -1
    truncation: str = "error"
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class GenerationModelConfig:
    path: str = "~/models/Qwen2.5-0.5B-Instruct"
    tokenizer_path: str | None = None
    trust_remote_code: bool = False
    external_lib: str | None = None
    override_config: dict[str, Any] = field(default_factory=dict)
    custom_chat_template: str | None = None


@dataclass
class GenerationTrainerConfig:
    nnodes: int = 1
    n_gpus_per_node: int = 8
    device: str = "cuda"
    phase_timeout_s: float | None = 3600


def generation_rollout_defaults() -> RolloutConfig:
    """Nothing trains next to the engine: it loads its own weights, keeps them awake and skips log-probs."""
    return RolloutConfig(load_format="auto", free_cache_engine=False, calculate_log_probs=False,
                         gpu_memory_utilization=0.8, sleep_level=1)


@dataclass
class GenerationConfig:
    data: GenerationDataConfig = field(default_factory=GenerationDataConfig)
    model: GenerationModelConfig = field(default_factory=GenerationModelConfig)
    rollout: RolloutConfig = field(default_factory=generation_rollout_defaults)
    trainer: GenerationTrainerConfig = field(default_factory=GenerationTrainerConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
