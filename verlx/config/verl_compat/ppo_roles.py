"""Compatibility rows of the actor, reference and critic sections and their models (veRL 0.9.1 and older)."""

from __future__ import annotations

from verlx.config.legacy_keys import Ignored, Moved, Refused

ACTOR, REF, CRITIC = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"
MODEL = "actor_rollout_ref.model"
ROLES = (ACTOR, REF, CRITIC)
TORCHTITAN = "veRL's torchtitan engine (model_engine=torchtitan), which verlx does not have"
VEOMNI = "veRL's VeOmni engine (model_engine=veomni), which verlx does not have"
FSDP_TURBO = "veRL's FSDP-Turbo engine (strategy=fsdp_turbo, the fsdp_turbo package; verlx's FSDP engine is fsdp2)"
PACKED = "verlx packs the sequences of a micro-batch (actor_rollout_ref.model.use_remove_padding) rather than padding"
NO_TRAINING = "the reference does not train"
MUON_KEYS = ("coefficient_type", "extra_scale_factor", "fp32_matmul_prec", "match_adamw_update_rms", "momentum",
             "nesterov", "num_ns_steps", "scalar_optimizer", "scale_mode", "split_qkv", "tp_mode")


def role_profiler_rows(section: str) -> list:
    """A role's profiler keys that verlx's phase profiler has no use for (ppo_run.profiler_rows, and the tools')."""
    from verlx.config.verl_compat.ppo_run import profiler_rows

    tools = "which verlx refuses as the profiler tool, naming the tools it has"
    return [
        *profiler_rows(section),
        Ignored(f"{section}.tool_config.npu", f"read only by the Ascend NPU profiler, {tools}"),
        Ignored(f"{section}.tool_config.precision_debugger", f"read only by the precision_debugger tool, {tools}"),
        Ignored(f"{section}.tool_config.torch.schedule", "verlx traces each phase whole (a schedule would keep only "
                "some of the update's mini-batches in the trace)"),
        Ignored(f"{section}.tool_config.torch.profile_token_start", "verlx traces each phase whole"),
        Ignored(f"{section}.tool_config.torch.profile_token_end", "verlx traces each phase whole"),
    ]


def _every_role() -> list:
    rows = []
    for role in ROLES:
        rows += [
            Ignored(f"{role}.torchtitan", f"read only by {TORCHTITAN}"),
            Ignored(f"{role}.veomni", f"read only by {VEOMNI}"),
            Refused(f"{role}.strategy", FSDP_TURBO, asked_by=("fsdp_turbo",)),
            Ignored(f"{role}.rollout_n", "veRL copies actor_rollout_ref.rollout.n here; verlx reads that key"),
            Ignored(f"{role}.pad_to_length", PACKED),
            *role_profiler_rows(f"{role}.profiler"),
            Refused(f"{role}.router_replay", "MoE routing replay", inert=(None, False, "disabled"),
                    switch=f"{role}.router_replay.mode"),
            Refused(f"{role}.qat", "quantization-aware training", switch=f"{role}.qat.enable"),
        ]
        rows += _megatron(role)
    return rows


def _megatron(role: str) -> list:
    m = f"{role}.megatron"
    return [
        Refused(f"{m}.dist_checkpointing_prefix", "a key prefix in the megatron dist-checkpoint it loads (NeMo's "
                "'module.')", inert=(None, "")),
        Ignored(f"{m}.dist_ckpt_optim_fully_reshardable", "verlx always saves the distributed optimizer in megatron's "
                "fully_reshardable format (verlx/workers/megatron/checkpoint.py)"),
        Ignored(f"{m}.distrib_optim_fully_reshardable_mem_efficient", "how veRL gathers the optimizer while saving "
                "it; verlx saves the fully_reshardable format its own way, and training is the same"),
        Refused(f"{m}.override_mcore_model_config", "megatron model-config overrides", inert=(None, {})),
        Refused(f"{m}.use_megatron_fsdp", "megatron-FSDP"),
        Refused(f"{m}.dynamic_context_parallel", "dynamic context parallelism"),
        Refused(f"{m}.max_seqlen_per_dp_cp_rank", "dynamic context parallelism"),
        Ignored(f"{m}.forward_only", "veRL sets it for roles that do not train; verlx knows which roles train"),
        Ignored(f"{m}.pad_bshd_to_minibatch_max", PACKED),
        Ignored(f"{m}.pad_to_length", PACKED),
        Ignored(f"{m}.pad_to_length_bucket", PACKED),
        Ignored(f"{m}.use_remove_padding", "verlx reads actor_rollout_ref.model.use_remove_padding for every engine"),
        Ignored(f"{m}.entropy_from_logits_with_chunking",
                "verlx reads actor_rollout_ref.actor.entropy_from_logits_with_chunking for every engine"),
        Ignored(f"{m}.entropy_from_logits_chunk_size", "verlx reads actor_rollout_ref.actor.logprob_chunk_size"),
        Refused(f"{m}.router_replay", "MoE routing replay", inert=(None, False, "disabled"),
                switch=f"{m}.router_replay.mode"),
        Refused(f"{m}.qat", "quantization-aware training", switch=f"{m}.qat.enable"),
    ]


def _fsdp_engine(section: str, role: str, trains: bool) -> list:
    """veRL 0.9.1's FSDP engine keys verlx's fsdp_config lacks; some are the role's own keys in verlx."""
    rows = [
        Moved(f"{section}.ulysses_sequence_parallel_size", f"{role}.ulysses_sequence_parallel_size",
              "verlx keeps the sequence-parallel size on the role", current=True),
        Moved(f"{section}.use_torch_compile", f"{role}.use_torch_compile", "verlx keeps it on the role",
              current=True),
        Ignored(f"{section}.forward_only", "veRL sets it for roles that do not train; verlx knows which roles train"),
        Ignored(f"{section}.strategy", f"the engine is {role}.strategy"),
        Ignored(f"{section}.seed", "verlx seeds every worker from trainer.seed"),
        Ignored(f"{section}.use_orig_params", "an FSDP1 option; verlx's engine is FSDP2"),
        Ignored(f"{section}.pad_to_length", PACKED),
        Ignored(f"{section}.pad_to_length_bucket", PACKED),
        Ignored(f"{section}.turbo_config", f"read only by {FSDP_TURBO.split(' (')[0]}, which verlx does not have"),
        Refused(f"{section}.full_determinism", "bitwise-deterministic training kernels"),
        Refused(f"{section}.qat", "quantization-aware training", switch=f"{section}.qat.enable"),
    ]
    if trains:
        rows += [
            Moved(f"{section}.use_no_sync_for_gradient_accumulation", f"{section}.defer_grad_reduce",
                  "verlx's name for reducing gradients once per mini-batch", current=True),
            Moved(f"{section}.entropy_checkpointing", f"{role}.entropy_checkpointing", "verlx keeps it on the role",
                  current=True),
            Moved(f"{section}.entropy_from_logits_with_chunking", f"{role}.entropy_from_logits_with_chunking",
                  "verlx keeps it on the role", current=True),
            Moved(f"{section}.entropy_from_logits_chunk_size", f"{role}.logprob_chunk_size",
                  "verlx's chunk size of log-probs and entropy", current=True),
        ]
    else:
        rows += [Ignored(f"{section}.{key}", "verlx's reference has no such setting: it does not train or compute "
                         "an entropy, and shards like the actor") for key in (
            "optimizer_offload", "offload_policy", "fsdp_size", "forward_prefetch", "entropy_checkpointing",
            "entropy_from_logits_with_chunking", "entropy_from_logits_chunk_size", "defer_grad_reduce",
            "use_no_sync_for_gradient_accumulation")]
    return rows


def optimizer_rows(section: str) -> list:
    """Optimizer keys of veRL's FSDP and megatron optimizer groups that verlx's AdamW lacks."""
    rows = [
        Moved(f"{section}.name", f"{section}.optimizer", "verlx's name of the optimizer key", current=True),
        Refused(f"{section}.optimizer_impl", "optimizers from other modules (verlx uses torch.optim.AdamW)",
                inert=(None, "torch.optim")),
        Refused(f"{section}.eps", "a configurable AdamW epsilon (verlx uses 1e-8)", inert=(None, 1e-8)),
        Refused(f"{section}.zero_indexed_step", "one-indexed learning-rate schedules", inert=(None, True)),
        Refused(f"{section}.use_precision_aware_optimizer", "megatron's precision-aware optimizer"),
        Refused(f"{section}.use_layer_wise_distributed_optimizer", "megatron's layer-wise distributed optimizer"),
        Refused(f"{section}.main_grads_dtype", "reduced-precision optimizer state", inert=(None, "fp32")),
        Refused(f"{section}.exp_avg_dtype", "reduced-precision optimizer state", inert=(None, "fp32")),
        Refused(f"{section}.exp_avg_sq_dtype", "reduced-precision optimizer state", inert=(None, "fp32")),
    ]
    rows += [Ignored(f"{section}.muon_{key}", "read only by the Muon optimizer; optim.optimizer chooses the optimizer")
             for key in MUON_KEYS]
    rows += [Ignored(f"{section}.{key}", f"read only by {TORCHTITAN.split(' (')[0]} and VeOmni optimizers")
             for key in ("decay_type", "lr_start", "lr_min", "min_lr_factor", "lr_decay_ratio")]
    return rows


def _model(model: str) -> list:
    return [
        Refused(f"{model}.hf_config_path", "a HF config directory apart from the model's", inert=(None,)),
        Refused(f"{model}.use_liger", "Liger kernels"),
        Refused(f"{model}.fused_kernel_options", "other fused-kernel backends", inert=(None, "torch")),
        Refused(f"{model}.tiled_mlp", "tiled MLP", switch=f"{model}.tiled_mlp.enabled"),
        Refused(f"{model}.mtp", "multi-token prediction (MTP)", switch=f"{model}.mtp.enable"),
        Moved(f"{model}.lora.rank", f"{model}.lora_rank", "verlx's LoRA keys", current=True),
        Moved(f"{model}.lora.alpha", f"{model}.lora_alpha", "verlx's LoRA keys", current=True),
        Moved(f"{model}.lora.adapter_path", f"{model}.lora_adapter_path", "verlx's LoRA keys", current=True),
        Moved(f"{model}.lora.target_modules", f"{model}.target_modules", "verlx's LoRA keys", current=True),
        Moved(f"{model}.lora.exclude_modules", f"{model}.exclude_modules", "verlx's LoRA keys", current=True),
        Refused(f"{model}.lora", "megatron LoRA options (verlx's LoRA is PEFT on FSDP)", inert=(
            None, False, [], "lora", 0.0, "pre", "xavier", "zero", True), switch=f"{model}.lora.rank"),
    ]


ROWS = [
    *_every_role(),
    *_fsdp_engine(f"{ACTOR}.fsdp_config", ACTOR, trains=True),
    *_fsdp_engine(f"{REF}.fsdp_config", REF, trains=False),
    *_fsdp_engine(f"{CRITIC}.model.fsdp_config", CRITIC, trains=True),
    *_fsdp_engine(f"{CRITIC}.fsdp", CRITIC, trains=True),
    Moved(f"{CRITIC}.fsdp", f"{CRITIC}.model.fsdp_config", "verlx keeps the critic's FSDP settings with its model",
          current=True),
    *optimizer_rows(f"{ACTOR}.optim"),
    *optimizer_rows(f"{CRITIC}.optim"),
    Ignored(f"{REF}.optim", NO_TRAINING),
    *_model(MODEL),
    *_model(f"{CRITIC}.model"),
    # actor
    Ignored(f"{ACTOR}.sum_pi_squared_checkpointing", "verlx computes Σπ² with no gradient, a chunk of tokens at "
            "a time, so there are no activations to checkpoint"),
    Ignored(f"{ACTOR}.calculate_entropy", "verlx computes the entropy of every update (logged as actor/entropy)"),
    Moved(f"{ACTOR}.entropy_from_logits_chunk_size", f"{ACTOR}.logprob_chunk_size",
          "verlx's chunk size of log-probs and entropy", current=True),
    Ignored(f"{ACTOR}.checkpoint.mbridge_config", "mbridge's save options (a distributed filesystem, memory use); "
            "verlx's megatron engine saves HF weights with its own converter"),
    Refused(f"{ACTOR}.checkpoint.strict", "non-strict checkpoint loading", inert=(None, True)),
    Refused(f"{ACTOR}.use_prefix_grouper", "prefix grouping (one forward of a shared prompt)"),
    Moved(f"{ACTOR}.use_fused_kernels", f"{MODEL}.use_fused_kernels", "verlx reads it on the model",
          current=True),
    Moved(f"{ACTOR}.use_remove_padding", f"{MODEL}.use_remove_padding", "verlx reads it on the model",
          current=True),
    Moved(f"{ACTOR}.optim.warmup_style", f"{ACTOR}.optim.lr_scheduler_type",
          "veRL renamed warmup_style to lr_scheduler_type"),
    # reference
    Ignored(f"{REF}.entropy_checkpointing", f"{NO_TRAINING} or compute an entropy"),
    Ignored(f"{REF}.entropy_from_logits_with_chunking", f"{NO_TRAINING} or compute an entropy"),
    Ignored(f"{REF}.entropy_from_logits_chunk_size", f"{NO_TRAINING} or compute an entropy"),
    # critic
    Ignored(f"{CRITIC}.nccl_timeout", "the critic shares actor_rollout_ref.nccl_timeout in verlx"),
    Ignored(f"{CRITIC}.checkpoint.mbridge_config", "mbridge's save options (a distributed filesystem, memory use); "
            "verlx's megatron engine saves HF weights with its own converter"),
    Refused(f"{CRITIC}.checkpoint.strict", "non-strict checkpoint loading", inert=(None, True)),
    Ignored(f"{CRITIC}.model.custom_chat_template", "the critic reads the actor's tokens; no chat template"),
    Refused(f"{CRITIC}.model.lora_adapter_path", "starting the critic from a LoRA adapter"),
    Refused(f"{CRITIC}.model.exclude_modules", "LoRA module exclusion for the critic"),
    Ignored(f"{CRITIC}.model.use_fused_kernels", "fused log-prob kernels are the policy's; the value head computes "
            "no log-probs"),
    Moved(f"{CRITIC}.optim.warmup_style", f"{CRITIC}.optim.lr_scheduler_type",
          "veRL renamed warmup_style to lr_scheduler_type"),
]
