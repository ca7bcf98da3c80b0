"""Typed configs of data, rewards, the algorithm and the run itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verlx.config.profiler import ProfilerConfig
from verlx.config.reward_model import OverlongBufferConfig, RewardKwargsConfig, RewardModelModelConfig


@dataclass
class CustomClassConfig:
    """data.custom_cls: a Dataset class from a user file (veRL's keys)."""

    path: str | None = None
    name: str | None = None


@dataclass
class SamplerClassConfig:
    """data.sampler: a (curriculum) sampler class from a user file or package (veRL's keys)."""

    class_path: str | None = None
    class_name: str | None = None


@dataclass
class DataConfig:
    tokenizer: str | None = None
    train_files: str | list[str] = "~/data/gsm8k/train.parquet"
    val_files: str | list[str] | None = "~/data/gsm8k/test.parquet"
    train_max_samples: int = -1
    val_max_samples: int = -1
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    image_key: str | None = "images"
    image_patch_size: int | None = None
    max_prompt_length: int = 512
    max_response_length: int = 512
    train_batch_size: int = 1024
    val_batch_size: int | None = None
    return_raw_chat: bool = False
    return_raw_input_ids: bool = False
    return_full_prompt: bool = False
    shuffle: bool = True
    seed: int | None = None
    validation_shuffle: bool = False
    filter_overlong_prompts: bool = False
    filter_overlong_prompts_workers: int = 1
    truncation: str = "error"
    skip_bad_rows: bool = False
    trust_remote_code: bool = False
    dataloader_num_workers: int = 0
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    gen_batch_size: int | None = None
    custom_cls: CustomClassConfig = field(default_factory=CustomClassConfig)
    sampler: SamplerClassConfig = field(default_factory=SamplerClassConfig)


@dataclass
class RewardModelConfig:
    enable: bool = False
    strategy: str = "fsdp"
    model: RewardModelModelConfig = field(default_factory=RewardModelModelConfig)
    micro_batch_size: int | None = None
    micro_batch_size_per_gpu: int | None = None
    max_length: int | None = None
    use_dynamic_bsz: bool | None = None
    forward_max_token_len_per_gpu: int | None = None
    ulysses_sequence_parallel_size: int = 1
    num_workers: int | None = None
    reward_manager: str = "naive"
    launch_reward_fn_async: bool = False
    overlong_buffer: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    reward_kwargs: RewardKwargsConfig = field(default_factory=RewardKwargsConfig)
    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)


@dataclass
class RewardConfig:
    num_workers: int = 2
    timeout_s: float = 30.0
    error_score: float = 0.0
    max_error_fraction: float = 0.1
    show_errors: int = 3


@dataclass
class CustomRewardFunctionConfig:
    path: str | None = None
    name: str = "compute_score"
    reward_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class KLControlConfig:
    type: str = "fixed"
    kl_coef: float = 0.001
    horizon: int = 10000
    target_kl: float = 0.1


@dataclass
class FilterGroupsConfig:
    enable: bool = False
    metric: str | None = "score"
    max_num_gen_batches: int = 10


@dataclass
class RolloutCorrectionConfig:
    rollout_is: str | None = None
    rollout_is_threshold: str | float = 2.0
    rollout_is_batch_normalize: bool = False
    rollout_rs: str | None = None
    rollout_rs_threshold: str | float | None = None
    bypass_mode: bool = False
    loss_type: str = "ppo_clip"


@dataclass
class AlgorithmConfig:
    gamma: float = 1.0
    lam: float = 1.0
    adv_estimator: str = "gae"
    norm_adv_by_std_in_grpo: bool = True
    gdpo_reward_keys: list[str] | None = None
    gdpo_reward_weights: list[float] | None = None
    use_kl_in_reward: bool = False
    kl_penalty: str = "kl"
    kl_ctrl: KLControlConfig = field(default_factory=KLControlConfig)
    filter_groups: FilterGroupsConfig = field(default_factory=FilterGroupsConfig)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)


# trainer.resume_mode: the latest complete checkpoint, none, or trainer.resume_from_path
RESUME_MODES = ("auto", "disable", "resume_path")


@dataclass
class TrainerConfig:
    balance_batch: bool = True
    total_epochs: int = 30
    total_training_steps: int | None = None
    project_name: str = "verlx_examples"
    experiment_name: str = "gsm8k"
    logger: str | list[str] = field(default_factory=lambda: ["console", "file"])
    log_val_generations: int = 0
    rollout_data_dir: str | None = None
    validation_data_dir: str | None = None
    nnodes: int = 1
    n_gpus_per_node: int = 8
    save_freq: int = -1
    resume_mode: str = "auto"
    resume_from_path: str | None = None
    allow_finished_resume: bool = False
    val_before_train: bool = True
    val_only: bool = False
    test_freq: int = -1
    critic_warmup: int = 0
    default_local_dir: str = "checkpoints/verlx_examples/gsm8k"
    default_hdfs_dir: str | None = None
    del_local_ckpt_after_load: bool = False
    max_actor_ckpt_to_keep: int | None = None
    max_critic_ckpt_to_keep: int | None = None
    device: str = "cuda"
    seed: int = 1
    output_dir: str = "outputs/verlx_examples/gsm8k"
    phase_timeout_s: float | None = 3600
    phase_timeouts: dict[str, float] = field(default_factory=dict)
    max_restarts: int = 0
    save_on_signal: bool = True
    save_on_signal_timeout_s: float | None = 600
    max_consecutive_nonfinite_updates: int = 3
    progress_bar: bool = True
    compile_cache_dir: str | None = "~/.cache/verlx/compile"
    rollout_mode: str = "sync"
    max_staleness: int | None = None
    staleness_policy: str = "wait"
    partial_rollout: bool = False
    rollout_stall_timeout_s: float | None = 3600
    on_policy_tolerance: float | None = None

    @property
    def loggers(self) -> list[str]:
        return [self.logger] if isinstance(self.logger, str) else list(self.logger)


@dataclass
class RolloutResourcesConfig:
    nnodes: int = 1
    n_gpus_per_node: int = 0


@dataclass
class RayInitConfig:
    num_cpus: int | None = None
    num_gpus: int | None = None
    address: str | None = None
    runtime_env: dict[str, Any] = field(default_factory=dict)


@dataclass
class RayKwargsConfig:
    ray_init: RayInitConfig = field(default_factory=RayInitConfig)
    timeline_json_file: str | None = None
