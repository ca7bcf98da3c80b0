"""Typed config of `python -m verlx.trainer.main_eval` (evaluation.yaml; keys follow veRL's evaluation.yaml)."""

from __future__ import annotations

from dataclasses import dataclass, field

from verlx.config.run import CustomRewardFunctionConfig, RewardConfig


@dataclass
class EvaluationDataConfig:
    path: str = "~/data/gsm8k/test.generations.parquet"
    prompt_key: str = "prompt"
    response_key: str = "responses"
    data_source_key: str = "data_source"
    reward_model_key: str = "reward_model"
    extra_info_key: str = "extra_info"


@dataclass
class EvaluationMetricsConfig:
    pass_threshold: float = 1.0


@dataclass
class EvaluationConfig:
    data: EvaluationDataConfig = field(default_factory=EvaluationDataConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    metrics: EvaluationMetricsConfig = field(default_factory=EvaluationMetricsConfig)
    output_path: str | None = None
