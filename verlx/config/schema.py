"""The root config: one typed dataclass per YAML section of ppo_trainer.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field

from verlx.config.distillation import DistillationConfig
from verlx.config.profiler import GlobalProfilerConfig
from verlx.config.roles import ActorRolloutRefConfig, CriticConfig
from verlx.config.run import (
    AlgorithmConfig,
    CustomRewardFunctionConfig,
    DataConfig,
    RayKwargsConfig,
    RewardConfig,
    RewardModelConfig,
    RolloutResourcesConfig,
    TrainerConfig,
)


@dataclass
class PPOConfig:
    """Whether a critic runs depends on the estimator registry: verlx.algorithms.advantages.uses_critic(config)."""

    data: DataConfig = field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    custom_reward_function: CustomRewardFunctionConfig = field(default_factory=CustomRewardFunctionConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    rollout: RolloutResourcesConfig = field(default_factory=RolloutResourcesConfig)
    ray_kwargs: RayKwargsConfig = field(default_factory=RayKwargsConfig)
    global_profiler: GlobalProfilerConfig = field(default_factory=GlobalProfilerConfig)
    distillation: DistillationConfig = field(default_factory=DistillationConfig)

    @property
    def use_reference(self) -> bool:
        return self.algorithm.use_kl_in_reward or self.actor_rollout_ref.actor.use_kl_loss

    @property
    def uses_ref_log_prob_settings(self) -> bool:
        """A frozen model's log-prob phase runs, batched with actor_rollout_ref.ref's settings: the reference's, or
        a distillation teacher's (with or without a reference)."""
        return self.use_reference or self.distillation.enabled
