"""Typed config of the SFT trainer (sft_trainer.yaml); its cross-key checks are verlx.trainer.preflight_sft.

Keys follow veRL's sft_trainer.yaml where veRL has them; the defaults are tuned for the embedded tiny model
(verlx.models.tiny) so that the quick start's one-liner needs only paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEVICES = ("auto", "cpu", "cuda")


@dataclass
class MultiTurnSFTConfig:
    """data.multiturn: rows are conversations (veRL's multi-turn SFT data)."""

    enable: bool = False
    messages_key: str = "messages"
    tools_key: str = "tools"
    enable_thinking_key: str = "enable_thinking"
    enable_thinking_default: bool | None = None


@dataclass
class SFTDataConfig:
    train_files: str | list[str] = "~/data/arithmetic/train.parquet"
    val_files: str | list[str] | None = "~/data/arithmetic/test.parquet"
    train_max_samples: int = -1
    val_max_samples: int = 500
    prompt_key: str = "prompt"
    response_key: str = "extra_info.answer"
    ground_truth_key: str = "reward_model.ground_truth"
    reward_fn_key: str = "data_source"
    max_length: int = 512
    truncation: str = "error"
    train_batch_size: int = 32
    micro_batch_size_per_gpu: int = 32
    use_dynamic_bsz: bool = False
    max_token_len_per_gpu: int = 8192
    multiturn: MultiTurnSFTConfig = field(default_factory=MultiTurnSFTConfig)
    shuffle: bool = True
    val_batch_size: int = 250
    val_max_new_tokens: int = 32
    apply_chat_template_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class SFTModelConfig:
    partial_pretrain: str | None = None
    trust_remote_code: bool = False
    enable_gradient_checkpointing: bool = False
    attn_implementation: str = "sdpa"
    use_remove_padding: bool = False
    ulysses_sequence_parallel_size: int = 1
    lora_rank: int = 0
    lora_alpha: int = 16
    target_modules: str | list[str] = "all-linear"
    exclude_modules: str | list[str] | None = None
    lora_adapter_path: str | None = None

    @property
    def packed(self) -> bool:
        """Micro-batches run as one packed row of real tokens (needed by Ulysses sequence parallelism)."""
        return self.use_remove_padding or self.ulysses_sequence_parallel_size > 1


@dataclass
class SFTOptimConfig:
    lr: float = 3e-3
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    weight_decay: float = 0.01
    lr_warmup_steps_ratio: float = 0.05
    lr_scheduler: str = "cosine"
    min_lr_ratio: float = 0.0
    clip_grad: float | None = 1.0


@dataclass
class SFTTrainerConfig:
    default_local_dir: str = "checkpoints/verlx_sft/arithmetic"
    output_dir: str = "outputs/verlx_sft/arithmetic"
    project_name: str = "verlx_sft"
    experiment_name: str = "arithmetic"
    total_epochs: int = 1000
    total_training_steps: int | None = 600
    log_freq: int = 20
    test_freq: int = 100
    save_freq: int = -1
    max_ckpt_to_keep: int | None = None
    resume_mode: str = "auto"
    target_val_accuracy: float | None = None
    logger: str | list[str] = field(default_factory=lambda: ["console", "file"])
    seed: int = 1
    device: str = "auto"
    nnodes: int | None = None
    n_gpus_per_node: int | None = None
    save_on_signal: bool = True
    save_on_signal_timeout_s: float | None = 600

    @property
    def loggers(self) -> list[str]:
        return [self.logger] if isinstance(self.logger, str) else list(self.logger)


@dataclass
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)
