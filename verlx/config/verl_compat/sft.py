"""Compatibility rows of the SFT trainers: veRL's fsdp_sft_trainer (sft_trainer.yaml of veRL before 0.9) and
veRL 0.9.1's sft_trainer (sft_trainer_engine.yaml: model.path, engine.*, messages data)."""

from __future__ import annotations

from verlx.config.legacy_keys import Ignored, Joined, Moved, Refused
from verlx.config.verl_compat.ppo_roles import optimizer_rows
from verlx.config.verl_compat.ppo_run import NPU

CKPT_STATE = ("resumable SFT checkpoints (verlx's, every trainer.save_freq steps, hold the model, not the "
              "optimizer state)")
ONE_PROCESS_LAYOUT = "verlx's SFT trainer shards the model over every process with FSDP2, one layer at a time"

LEGACY = [
    Joined("data.prompt_dict_keys", "data.prompt_key", "verlx reads a field of a dict column as a dotted path"),
    Joined("data.response_dict_keys", "data.response_key", "verlx reads a field of a dict column as a dotted path"),
    Ignored("data.micro_batch_size", "veRL's fsdp_sft_trainer does not read it either: micro-batches are "
            "data.micro_batch_size_per_gpu rows (or data.max_token_len_per_gpu tokens)"),
    Refused("data.balance_dp_token", "token-balanced data-parallel SFT batches"),
    Refused("data.chat_template", "a chat template in the SFT data config (verlx uses the tokenizer's)"),
    Refused("data.custom_cls", "SFT dataset classes loaded from a user file"),
    Ignored("data.use_shm", "verlx reads the parquet files where they are"),
    Ignored("model.use_shm", "verlx loads the model from its directory"),
    Refused("model.fsdp_config.cpu_offload", "CPU offload in SFT"),
    Refused("model.fsdp_config.offload_params", "CPU offload in SFT"),
    Refused("model.fsdp_config.model_dtype", "other SFT master-weight dtypes (verlx keeps fp32)",
            inert=(None, "fp32", "float32")),
    Ignored("model.fsdp_config.wrap_policy", ONE_PROCESS_LAYOUT),
    Refused("model.external_lib", "custom model libraries in SFT"),
    Refused("model.use_liger", "Liger kernels"),
    Refused("model.strategy", "other SFT strategies (verlx's SFT is FSDP2)", inert=(None, "fsdp", "fsdp2")),
    Moved("ulysses_sequence_parallel_size", "model.ulysses_sequence_parallel_size", "verlx keeps the Ulysses size "
          "with the model", current=True),
    Moved("use_remove_padding", "model.use_remove_padding", "veRL 0.9.1's place of the key", current=True),
]

ENGINE = [
    Moved("model.path", "model.partial_pretrain", "verlx's name of the model to fine-tune", current=True),
    Refused("model.tokenizer_path", "an SFT tokenizer apart from the model's"),
    Refused("model.hf_config_path", "a HF config directory apart from the model's"),
    Refused("model.custom_chat_template", "a custom chat template in SFT"),
    Refused("model.override_config", "HF config overrides in SFT", inert=(None, {})),
    Refused("model.enable_activation_offload", "activation offload in SFT"),
    Ignored("model.use_fused_kernels", "verlx's SFT trainer forms logits only at response positions, in chunks"),
    Ignored("model.fused_kernel_options", "verlx's SFT trainer forms logits only at response positions, in chunks"),
    Refused("model.tiled_mlp", "tiled MLP", switch="model.tiled_mlp.enabled"),
    Refused("model.mtp", "multi-token prediction (MTP)", switch="model.mtp.enable"),
    Moved("model.lora.rank", "model.lora_rank", "verlx's LoRA keys", current=True),
    Moved("model.lora.alpha", "model.lora_alpha", "verlx's LoRA keys", current=True),
    Moved("model.lora.adapter_path", "model.lora_adapter_path", "verlx's LoRA keys", current=True),
    Moved("model.lora.target_modules", "model.target_modules", "verlx's LoRA keys", current=True),
    Moved("model.lora.exclude_modules", "model.exclude_modules", "verlx's LoRA keys", current=True),
    Refused("model.lora", "megatron LoRA options (verlx's LoRA is PEFT on FSDP)", inert=(
        None, False, [], "lora", 0.0, "pre", "xavier", "zero", True), switch="model.lora.rank"),
    Moved("engine.ulysses_sequence_parallel_size", "model.ulysses_sequence_parallel_size",
          "verlx keeps the Ulysses size with the model", current=True),
    Refused("engine.param_offload", "CPU offload in SFT"),
    Refused("engine.optimizer_offload", "CPU offload in SFT"),
    Refused("engine.offload_policy", "CPU offload in SFT"),
    Refused("engine.strategy", "other SFT engines (verlx's SFT is FSDP2)", inert=(None, "fsdp", "fsdp2")),
    Refused("engine.full_determinism", "bitwise-deterministic training kernels"),
    Refused("engine.qat", "quantization-aware training", switch="engine.qat.enable"),
    Ignored("engine", ONE_PROCESS_LAYOUT),
    *[Moved(f"data.{key}", f"data.multiturn.{key}", "verlx keeps the conversation keys under data.multiturn "
            "(veRL's fsdp_sft_trainer layout)", current=True)
      for key in ("messages_key", "tools_key", "enable_thinking_key", "enable_thinking_default")],
    Ignored("data.ignore_input_ids_mismatch", "verlx renders each conversation once and finds the assistant turns "
            "in it, so there are no per-message tokens to mismatch (a template that rewrites earlier turns is refused, "
            "naming the row)"),
    Ignored("data.pad_mode", "verlx packs micro-batches without padding with model.use_remove_padding=true (veRL's "
            "no_padding) and right-pads them otherwise (veRL's right)"),
    Refused("data.num_workers", "SFT data-loader worker processes", inert=(None, 0, 8)),
    Refused("checkpoint", CKPT_STATE, inert=(None, ["model"], ["model", "optimizer", "extra"],
                                             "${checkpoint.save_contents}")),
    Refused("profiler", "SFT profilers", switch="profiler.enable"),
]

OPTIM_AND_TRAINER = [
    Refused("optim.optimizer", "other SFT optimizers (verlx's is AdamW)", inert=(None, "AdamW", "adamw")),
    Refused("optim.optimizer_impl", "optimizers from other modules", inert=(None, "torch.optim")),
    Ignored("optim.total_training_steps", "verlx takes the step count from trainer.total_training_steps"),
    Refused("optim.lr_warmup_steps", "warm-up by a step count (verlx: optim.lr_warmup_steps_ratio)",
            inert=(None, -1)),
    Refused("optim.num_cycles", "cosine schedules of other cycle counts", inert=(None, 0.5)),
    Moved("optim.lr_scheduler_type", "optim.lr_scheduler", "verlx's SFT name of the schedule", current=True),
    Moved("optim.warmup_style", "optim.lr_scheduler", "veRL's older name of the schedule"),
    Refused("optim.override_optimizer_config", "optimizer-config overrides"),
    Refused("optim.zero_indexed_step", "one-indexed learning-rate schedules", inert=(None, True)),
    Refused("trainer.device", NPU, inert=(None, "auto", "cpu", "cuda")),
    Refused("trainer.default_hdfs_dir", "HDFS copies of checkpoints"),
    Ignored("trainer.balance_batch", "verlx balances token-budget micro-batches (data.use_dynamic_bsz) by their "
            "token counts and splits the global batch evenly by rows"),
    Refused("trainer.resume_from_path", "resuming SFT from a checkpoint"),
    Refused("trainer.profile_interval", "SFT profilers", inert=(None, [-1, -1])),
    Refused("trainer.checkpoint", CKPT_STATE, inert=(None, ["model"], ["model", "optimizer", "extra"],
                                                     "${trainer.checkpoint.save_contents}")),
    Ignored("**._target_", "veRL's dataclass for the section; verlx builds its own typed config", quiet=True),
]

_OWN = {row.key for row in LEGACY + ENGINE + OPTIM_AND_TRAINER}
# veRL's megatron scheduler keys (sft_trainer_engine with optim=megatron; the PPO trainer's megatron roles read them)
# at their defaults: megatron's schedule, which verlx's FSDP SFT does not run
MEGATRON_SCHEDULE = {"lr_decay_style": (None, "constant"), "lr_decay_steps": (None,), "lr_warmup_init": (None, 0.0),
                     "min_lr": (None, 0.0), "weight_decay_incr_style": (None, "constant"),
                     "lr_wsd_decay_style": (None, "exponential"), "lr_wsd_decay_steps": (None,),
                     "use_checkpoint_opt_param_scheduler": (None, False)}
# veRL's other optimizer keys, as the PPO optimizer's rows say
MEGATRON_OPTIM = [row for row in optimizer_rows("optim") if row.key not in _OWN and row.key != "optim.name"] + [
    Refused(f"optim.{key}", "megatron's learning-rate schedule in SFT (verlx's SFT schedule is "
            "optim.lr_scheduler)", inert=inert) for key, inert in MEGATRON_SCHEDULE.items()]
ROWS = LEGACY + ENGINE + OPTIM_AND_TRAINER + MEGATRON_OPTIM
