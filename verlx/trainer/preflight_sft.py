"""Pre-flight checks of an SFT config (sft_trainer.yaml), run on every rank before the model loads."""

from __future__ import annotations

from verlx.config.loader import Findings
from verlx.config.ranges import SFT_RANGES, range_problems
from verlx.config.sft import DEVICES, SFTConfig
from verlx.utils.lr_schedules import LR_SCHEDULES
from verlx.utils.tracking import LOGGERS


def validate_sft(cfg: SFTConfig, world_size: int) -> None:
    """Checks across keys, all reported at once, each naming its keys and what would work."""
    from verlx.data.sft_dataset import TRUNCATIONS  # imports torch: not at module level, so config errors stay quick

    f = Findings()
    d, o, t = cfg.data, cfg.optim, cfg.trainer
    f.require(bool(cfg.model.partial_pretrain),
              "model.partial_pretrain is not set: give the model directory, e.g. model.partial_pretrain=~/models/tiny")
    f.choice("data.truncation", d.truncation, TRUNCATIONS)
    f.choice("trainer.device", t.device, DEVICES)
    f.choice("optim.lr_scheduler", o.lr_scheduler, LR_SCHEDULES.names())
    for name in t.loggers:  # the PPO trainer's loggers (verlx.utils.tracking), veRL's SFT scripts use wandb
        f.choice("trainer.logger", name, LOGGERS.names())
    for key, value in (
        ("data.train_batch_size", d.train_batch_size),
        ("data.micro_batch_size_per_gpu", d.micro_batch_size_per_gpu),
        ("data.max_length", d.max_length),
        ("data.val_batch_size", d.val_batch_size),
        ("data.val_max_new_tokens", d.val_max_new_tokens),
        ("trainer.log_freq", t.log_freq),
    ):
        f.require(value > 0, f"{key}={value} must be positive")
    check_layout(cfg, f, world_size)
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
    check_features(cfg, f)
    if t.nnodes is not None or t.n_gpus_per_node is not None:
        declared = (t.nnodes or 1) * (t.n_gpus_per_node or 1)
        f.require(
            declared == world_size,
            f"trainer.nnodes × trainer.n_gpus_per_node = {declared} but the launcher started {world_size} "
            f"process(es); match torchrun's --nnodes/--nproc_per_node, or leave both keys null",
        )
    f.problems += range_problems(cfg, SFT_RANGES)
    f.raise_problems()


def check_layout(cfg: SFTConfig, f: Findings, world_size: int) -> None:
    """Ulysses groups and data-parallel shards of the processes."""
    d, sp = cfg.data, cfg.model.ulysses_sequence_parallel_size
    if not f.require(sp >= 1 and world_size % sp == 0,
                     f"model.ulysses_sequence_parallel_size={sp} must divide the {world_size} process(es)"):
        return
    shards = world_size // sp
    f.require(
        d.train_batch_size <= 0 or d.train_batch_size % shards == 0,
        f"data.train_batch_size={d.train_batch_size} does not split evenly over {shards} data-parallel shard(s) "
        f"({world_size} processes / model.ulysses_sequence_parallel_size={sp}); use a multiple of {shards}",
    )
    f.require(not d.use_dynamic_bsz or d.max_token_len_per_gpu > 0,
              f"data.max_token_len_per_gpu={d.max_token_len_per_gpu} must be positive with data.use_dynamic_bsz=true")


def check_features(cfg: SFTConfig, f: Findings) -> None:
    """Multi-turn data, LoRA and saving every save_freq steps."""
    from verlx.models.lora import INSTALL_HINT, peft_available
    from verlx.trainer.sft_checkpoints import resume_problem

    m, t = cfg.model, cfg.trainer
    f.require(not (cfg.data.multiturn.enable and t.target_val_accuracy is not None),
              f"trainer.target_val_accuracy={t.target_val_accuracy} needs greedy-accuracy validation, but "
              "data.multiturn.enable=true validates by the conversations' loss (val/loss); set it to null")
    f.require(m.lora_rank >= 0, f"model.lora_rank={m.lora_rank} must be >= 0")
    if m.lora_rank > 0 or m.lora_adapter_path:
        f.require(peft_available(), f"model.lora_rank={m.lora_rank} needs the peft package: {INSTALL_HINT}")
    f.choice("trainer.resume_mode", t.resume_mode, ("auto", "disable"))
    f.require(t.max_ckpt_to_keep is None or t.max_ckpt_to_keep > 0,
              f"trainer.max_ckpt_to_keep={t.max_ckpt_to_keep} must be positive or null (keep all)")
    problem = resume_problem(t.default_local_dir, t.resume_mode)
    f.require(problem is None, problem or "")
