"""Typed configs of the worker roles: actor, reference, rollout engine and critic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verlx.config.engine import (
    CheckpointConfig,
    CriticModelConfig,
    FSDPConfig,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    RefFSDPConfig,
)
from verlx.config.profiler import ProfilerConfig


@dataclass
class PolicyLossConfig:
    loss_mode: str = "vanilla"
    clip_cov_ratio: float = 0.0002
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = 0.0002
    ppo_kl_coef: float = 0.1
    dro_beta: float | None = None


class ClipRange:
    """The clip bounds a policy loss reads (ActorConfig, distillation's loss section): each side's own ratio,
    else clip_ratio."""

    @property
    def clip_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def clip_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high


@dataclass
class ActorConfig(ClipRange):
    strategy: str = "fsdp"
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool | None = None
    ppo_max_token_len_per_gpu: int | None = None
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    tau_pos: float = 1.0
    tau_neg: float = 1.05
    policy_loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: int | None = None
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    calculate_sum_pi_squared: bool = False
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int = 42
    grad_clip: float = 1.0
    ulysses_sequence_parallel_size: int = 1
    entropy_checkpointing: bool = False
    entropy_from_logits_with_chunking: bool = False
    use_torch_compile: bool = True
    logprob_chunk_size: int = 4096
    freeze_vision_tower: bool = False
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)


@dataclass
class RefConfig:
    strategy: str = "fsdp"
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    ulysses_sequence_parallel_size: int = 1
    use_torch_compile: bool = True
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)


@dataclass
class SamplingConfig:
    top_k: int = -1
    top_p: float = 1.0
    temperature: float = 0.0
    n: int = 1
    do_sample: bool = False


@dataclass
class EngineKwargs:
    vllm: dict[str, Any] = field(default_factory=dict)
    sglang: dict[str, Any] = field(default_factory=dict)
    native: dict[str, Any] = field(default_factory=dict)
    custom: dict[str, Any] = field(default_factory=dict)


@dataclass
class MultiTurnConfig:
    enable: bool = False
    max_assistant_turns: int | None = 5
    max_user_turns: int | None = None
    max_parallel_calls: int = 1
    max_tool_response_length: int = 256
    tool_response_truncate_side: str = "middle"
    tool_timeout_s: float = 30.0
    tool_config_path: str | None = None
    interaction_config_path: str | None = None
    format: str = "hermes"
    on_template_mismatch: str = "mask"


@dataclass
class AgentLoopConfig:
    """veRL's `rollout.agent` section (docs/rollout.md, "rollout.mode=async")."""

    num_workers: int = 8
    default_agent_loop: str = "single_turn_agent"
    agent_loop_config_path: str | None = None


@dataclass
class RolloutServerConfig:
    """`rollout.server`: the engines serve their requests from HTTP servers verlx starts (docs/rollout.md)."""

    enable: bool = False
    host: str = "127.0.0.1"
    port: int | None = None
    startup_timeout_s: float = 600.0
    log_dir: str | None = None


# rollout.dtype: the names every rollout engine understands (each maps the short ones to its own spelling)
ROLLOUT_DTYPES = ("bfloat16", "bf16", "float16", "fp16", "float32", "fp32")


@dataclass
class RolloutConfig:
    name: str = "auto"
    mode: str = "sync"
    over_sample_rate: float = 0.0
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    prompt_length: int = 512
    response_length: int = 512
    dtype: str = "bfloat16"
    gpu_memory_utilization: float = 0.5
    ignore_eos: bool = False
    enforce_eager: bool = False
    free_cache_engine: bool = True
    tensor_model_parallel_size: int = 1
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    max_num_seqs: int = 256
    enable_chunked_prefill: bool = True
    enable_prefix_caching: bool = True
    load_format: str = "dummy"
    log_prob_micro_batch_size: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_use_dynamic_bsz: bool | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    disable_log_stats: bool = True
    do_sample: bool = True
    n: int = 1
    calculate_log_probs: bool = True
    seed: int = 0
    update_weights_bucket_megabytes: int = 512
    sleep_level: int = 2
    multi_stage_wake_up: bool = True
    layered_summon: bool = False
    engine_kwargs: EngineKwargs = field(default_factory=EngineKwargs)
    multi_turn: MultiTurnConfig = field(default_factory=MultiTurnConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    server: RolloutServerConfig = field(default_factory=RolloutServerConfig)
    val_kwargs: SamplingConfig = field(default_factory=SamplingConfig)

    @property
    def uses_agent_loop(self) -> bool:
        """Every batch goes through the agent-loop runner: rollout.mode=async (veRL's agent-loop rollout) or
        multi_turn.enable=true (tools; also with mode=sync)."""
        return self.mode == "async" or self.multi_turn.enable


@dataclass
class TrainingRolloutConfig(RolloutConfig):
    """actor_rollout_ref.rollout: the engine's keys plus those only training has (generation.yaml lacks them)."""

    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)


@dataclass
class ActorRolloutRefConfig:
    hybrid_engine: bool = True
    nccl_timeout: int = 600
    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    rollout: TrainingRolloutConfig = field(default_factory=TrainingRolloutConfig)


@dataclass
class CriticConfig:
    enable: bool | None = None
    strategy: str = "fsdp"
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-5))
    model: CriticModelConfig = field(default_factory=CriticModelConfig)
    ppo_mini_batch_size: int = 256
    ppo_micro_batch_size: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    forward_micro_batch_size: int | None = None
    forward_micro_batch_size_per_gpu: int | None = None
    use_dynamic_bsz: bool | None = None
    ppo_max_token_len_per_gpu: int | None = None
    forward_max_token_len_per_gpu: int | None = None
    ppo_epochs: int = 1
    shuffle: bool = False
    data_loader_seed: int = 42
    cliprange_value: float = 0.5
    loss_agg_mode: str = "token-mean"
    loss_scale_factor: int | None = None
    grad_clip: float = 1.0
    ulysses_sequence_parallel_size: int = 1
    use_torch_compile: bool = True
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
