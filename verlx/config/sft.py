"""Typed config of the SFT trainer (sft_trainer.yaml), with its cross-key checks.

Keys follow veRL's sft_trainer.yaml where veRL has them; the defaults are tuned for the embedded tiny model
(verlx.models.tiny) so that the quick start's one-liner needs only paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verlx.config.loader import Findings

TRUNCATIONS = ("error", "left", "right")
DEVICES = ("auto", "cpu", "cuda")
# the loggers of verlx.utils.tracking (shared with PPO) that the SFT trainer offers
SFT_LOGGERS = ("console", "file")


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
    train_batch_size: int = 64
    micro_batch_size_per_gpu: int = 64
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
    total_training_steps: int | None = 800
    log_freq: int = 20
    test_freq: int = 20
    target_val_accuracy: float | None = 0.15
    logger: str | list[str] = field(default_factory=lambda: ["console", "file"])
    seed: int = 1
    device: str = "auto"
    nnodes: int | None = None
    n_gpus_per_node: int | None = None

    @property
    def loggers(self) -> list[str]:
        return [self.logger] if isinstance(self.logger, str) else list(self.logger)


@dataclass
class SFTConfig:
    data: SFTDataConfig = field(default_factory=SFTDataConfig)
    model: SFTModelConfig = field(default_factory=SFTModelConfig)
    optim: SFTOptimConfig = field(default_factory=SFTOptimConfig)
    trainer: SFTTrainerConfig = field(default_factory=SFTTrainerConfig)


def validate_sft(cfg: SFTConfig, world_size: int) -> None:
    """Checks across keys, all reported at once, each naming its keys and what would work."""
    from verlx.utils.lr_schedules import LR_SCHEDULES

    f = Findings()
    d, o, t = cfg.data, cfg.optim, cfg.trainer
    f.require(bool(cfg.model.partial_pretrain),
              "model.partial_pretrain is not set: give the model directory, e.g. model.partial_pretrain=~/models/tiny")
    f.choice("data.truncation", d.truncation, TRUNCATIONS)
    f.choice("trainer.device", t.device, DEVICES)
    f.choice("optim.lr_scheduler", o.lr_scheduler, LR_SCHEDULES.names())
    for name in t.loggers:
        f.choice("trainer.logger", name, SFT_LOGGERS)
    for key, value in (
        ("data.train_batch_size", d.train_batch_size),
        ("data.micro_batch_size_per_gpu", d.micro_batch_size_per_gpu),
        ("data.max_length", d.max_length),
        ("data.val_batch_size", d.val_batch_size),
        ("data.val_max_new_tokens", d.val_max_new_tokens),
        ("trainer.log_freq", t.log_freq),
    ):
        f.require(value > 0, f"{key}={value} must be positive")
    f.require(
        d.train_batch_size <= 0 or d.train_batch_size % world_size == 0,
        f"data.train_batch_size={d.train_batch_size} does not split evenly over {world_size} processes; "
        f"use a multiple of {world_size}",
    )
    f.require(t.total_training_steps is not None or t.total_epochs > 0,
              f"trainer.total_epochs={t.total_epochs} must be positive when trainer.total_training_steps is null")
    f.require(t.total_training_steps is None or t.total_training_steps > 0,
              f"trainer.total_training_steps={t.total_training_steps} must be positive (or null to use epochs)")
    f.require(
        t.target_val_accuracy is None or (bool(d.val_files) and t.test_freq > 0),
        f"trainer.target_val_accuracy={t.target_val_accuracy} needs validation during training: set "
        f"data.val_files and trainer.test_freq > 0, or trainer.target_val_accuracy=null",
    )
    f.require(0.0 <= o.lr_warmup_steps_ratio < 1.0,
              f"optim.lr_warmup_steps_ratio={o.lr_warmup_steps_ratio} must be in [0, 1)")
    f.require(len(o.betas) == 2, f"optim.betas={o.betas} must hold two numbers")
    if t.nnodes is not None or t.n_gpus_per_node is not None:
        declared = (t.nnodes or 1) * (t.n_gpus_per_node or 1)
        f.require(
            declared == world_size,
            f"trainer.nnodes × trainer.n_gpus_per_node = {declared} but the launcher started {world_size} "
            f"process(es); match torchrun's --nnodes/--nproc_per_node, or leave both keys null",
        )
    f.raise_problems()
