"""Compatibility rows of keys that veRL's recipes (recipe/*, verl/experimental) and older releases add to
ppo_trainer: each names the recipe or the feature verlx lacks, or where verlx has it."""

from __future__ import annotations

from verlx.config.legacy_keys import Ignored, Moved, Refused

ACTOR, REF = "actor_rollout_ref.actor", "actor_rollout_ref.ref"
SERVER_MODE = ("verlx's agent-loop rollout (rollout.mode=async, multi_turn) streams the requests into the engine "
               "in its own process: there is no server to choose or set up")
FULLY_ASYNC = ("veRL's fully-asynchronous trainer (verl.experimental.fully_async_policy; verlx: "
               "trainer.rollout_mode=async)")
PRIME = "the PRIME recipe (implicit process rewards, accuracy filtering)"
SPIN = "the SPIN recipe (self-play fine-tuning)"
SPPO = "the SPPO recipe"
COLLABLLM = "the CollabLLM recipe's reward (multi-turn metrics judged by an LLM)"


def _fsdp_mixed_precision(section: str, trainable: bool = True) -> list:
    mp = f"{section}.mixed_precision"
    reduce = (Moved(f"{mp}.reduce_dtype", f"{section}.reduce_dtype", "verlx's FSDP gradient-reduction dtype",
                    current=True) if trainable else
              Ignored(f"{mp}.reduce_dtype", "the reference computes no gradients, so it reduces none"))
    return [
        Moved(f"{mp}.param_dtype", f"{section}.dtype", "verlx's FSDP compute dtype"),
        reduce,
        Refused(f"{mp}.buffer_dtype", "FSDP buffers in a dtype other than fp32", inert=(None, "fp32", "float32")),
    ]


ROWS = [
    # newer veRL (2026-08) and older key locations
    Moved("reward.reward_kwargs", "reward_model.reward_kwargs", "verlx keeps DAPO's reward_kwargs under "
          "reward_model, as veRL 0.9.1 does", current=True),
    *[Moved(f"{ACTOR}.policy_loss.{key}", f"{ACTOR}.{key}", "veRL 0.9.1's place of SAPO's temperatures", current=True)
      for key in ("tau_pos", "tau_neg")],
    *[Moved(f"{ACTOR}.{key}", f"{ACTOR}.policy_loss.{key}", "veRL moved the policy-loss options under policy_loss")
      for key in ("loss_mode", "clip_cov_ratio", "clip_cov_lb", "clip_cov_ub", "kl_cov_ratio", "ppo_kl_coef")],
    *_fsdp_mixed_precision(f"{ACTOR}.fsdp_config"),
    *_fsdp_mixed_precision(f"{REF}.fsdp_config", trainable=False),
    *_fsdp_mixed_precision("critic.model.fsdp_config"),
    Refused("algorithm.rollout_correction.rollout_rs_threshold_lower", "a separate lower rejection bound (verlx: "
            "rollout_rs_threshold='lower_upper')"),
    Refused("algorithm.rollout_correction.rollout_token_veto_threshold", "rollout correction's token veto"),
    Moved(f"{ACTOR}.use_rollout_log_probs", "algorithm.rollout_correction.bypass_mode", "veRL's fully-async "
          "trainers take the rollout's log-probs as the old policy's, as verlx's bypass mode does"),
    Refused("trainer.dump_high_diff_tokens", "dumps of tokens whose rollout and trainer log-probs differ"),
    Refused("trainer.dump_high_diff_dir", "dumps of tokens whose rollout and trainer log-probs differ"),
    Refused("actor_rollout_ref.rollout.moe_tensor_parallel_size", "expert tensor parallelism in the rollout",
            inert=(None, 1)),
    Refused("data.min_response_length", "a minimum response length"),
    Ignored("trainer.rl_logging_board_dir", "veRL's RL logging board; verlx logs through trainer.logger"),
    # server-mode rollout of veRL's 2025 releases
    Ignored("actor_rollout_ref.rollout.server", "settings of the HTTP server of veRL's older SGLang server mode "
            f"(timeouts, retries, connections); {SERVER_MODE}"),
    Ignored("actor_rollout_ref.rollout.sglang_rollout_mode", SERVER_MODE),
    # verl.experimental.fully_async_policy
    Refused("async_training", FULLY_ASYNC),
    Refused("rollout.n", FULLY_ASYNC),
    Refused("rollout.total_rollout_steps", FULLY_ASYNC),
    Refused("actor_rollout_ref.rollout.standalone_gpu_memory_utilization", FULLY_ASYNC),
    # recipes
    *[Refused(f"data.{key}", PRIME) for key in ("filter_accuracy", "accuracy_lower_bound", "accuracy_upper_bound",
                                                "oversample_factor", "filter_truncate")],
    *[Refused(f"reward_model.{key}", PRIME) for key in ("prime_granularity", "prime_norm", "mini_batch_size",
                                                        "prime_model")],
    *[Refused(f"reward_model.model.{key}", PRIME) for key in ("ref_path", "ref_type", "beta_train", "update",
                                                              "loss_type", "optim", "tokenizer_path")],
    Ignored("reward_model.model.enable_gradient_checkpointing", "the reward model does not train in verlx: no "
            "backward pass to checkpoint"),
    Ignored("reward_model.model.fsdp_config.optimizer_offload", "the reward model does not train in verlx: it has "
            "no optimizer"),
    Ignored("reward_model.model.fused_kernel_options", "fused log-prob kernels are the policy's; the reward model "
            "computes one score per sequence"),
    Moved("reward_model.model.fsdp_config.min_num_params", "reward_model.model.fsdp_config.wrap_policy.min_num_params",
          "the FSDP wrap policy's key"),
    Refused("algorithm.reward_gt_coef", PRIME),
    Refused("algorithm.reward_dpo_coef", PRIME),
    Ignored("trainer.debug", "a debug switch of veRL's recipe trainers"),
    Refused(f"{ACTOR}.dpo_beta", SPIN),
    Refused(f"{ACTOR}.load_weight", SPIN, inert=(None, True)),
    Refused(f"{REF}.load_weight", SPIN, inert=(None, True)),
    Refused("trainer.ref_update_freq", SPIN),
    Refused("trainer.log_freq", "the SPIN recipe's logging interval (verlx logs every step)", inert=(None, 1)),
    Refused(f"{ACTOR}.sppo_eta", SPPO),
    Refused("algorithm.sppo_eta", SPPO),
    Refused(f"{ACTOR}.gvpo_beta", "the GVPO recipe"),
    Refused("trainer.spo", "the SPO recipe (offline value estimates)", switch="trainer.spo.enable"),
    Refused("atropos", "the Atropos environment integration"),
    Refused("reward_model.reward_kwargs.metric_weights", COLLABLLM),
    Refused("reward_model.reward_kwargs.llm_judge_kwargs", COLLABLLM),
]
