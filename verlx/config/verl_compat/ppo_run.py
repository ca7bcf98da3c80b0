"""Compatibility rows of data, rewards, the algorithm, the trainer and veRL's run-wide sections."""

from __future__ import annotations

from verlx.config.legacy_keys import Alias, Ignored, Moved, Refused

VLM = "vision-language processor options"
RM_POOL = "a GPU pool of the reward model's own (verlx shards the reward model over the training GPUs)"
SANDBOX = "the Sandbox Fusion code-execution reward"
_GLOBAL_MICRO = "veRL's deprecated global micro-batch size; it is read as {new} = this value / the data-parallel size"


def _reward_model_rows(section: str) -> list:
    """veRL's keys of the inference server its reward loop serves the reward model with, and of a pool of its own."""
    return [
        Ignored(f"{section}.rollout", "settings of the inference server (vLLM/SGLang) veRL serves the reward model "
                "with; verlx runs the reward model's own forward pass, sharded with FSDP in the training workers "
                "(reward_model.micro_batch_size_per_gpu, reward_model.model.fsdp_config)"),
        Refused(f"{section}.enable_resource_pool", RM_POOL),
        Ignored(f"{section}.n_gpus_per_node", f"read only with {section}.enable_resource_pool=true, which verlx "
                "refuses"),
        Ignored(f"{section}.nnodes", f"read only with {section}.enable_resource_pool=true, which verlx refuses"),
    ]


def profiler_rows(section: str) -> list:
    """veRL's profiler keys that verlx's phase profiler (workers/profiling.py) has no use for."""
    return [
        Ignored(f"{section}.relocate_results", "verlx writes every torch trace into save_path itself; Nsight "
                "reports (tool=nsys) stay where Ray writes them, logs/nsight/ of its session directory"),
        Refused(f"{section}.finish_hook_cmd", "a shell command run after profiling (finish_hook_cmd)"),
        Ignored(f"{section}.finish_hook_all_ranks", "read only with finish_hook_cmd, which verlx refuses"),
        Ignored(f"{section}.finish_hook_ranks", "read only with finish_hook_cmd, which verlx refuses"),
    ]


DATA = [
    Refused("data.video_key", "video inputs of vision-language models", inert=(None, "videos")),
    Refused("data.audio_key", "audio inputs of vision-language models", inert=(None, "audios")),
    Refused("data.mm_processor_kwargs", "options of the vision-language processor (data.mm_processor_kwargs)"),
    Refused("data.return_multi_modal_inputs", VLM, inert=(None, False, True)),
    Refused("data.datagen", "dynamic data generators (data.datagen)"),
    Moved("data.tool_config_path", "actor_rollout_ref.rollout.multi_turn.tool_config_path",
          "verlx reads the tool config on the rollout", current=True),
    Refused("data.function_tool_path", "tools given as a Python file of functions"),
    Ignored("data.use_shm", "verlx reads the parquet files where they are"),
]

REWARD = [
    Moved("reward.custom_reward_function", "custom_reward_function", "verlx's reward function section",
          current=True),
    Moved("reward.reward_manager.name", "reward_model.reward_manager", "verlx's reward manager key", current=True),
    Refused("reward.reward_manager.source", "reward managers imported from a module (source=importlib)",
            inert=(None, "register")),
    Refused("reward.reward_manager.module", "reward managers imported from a module (source=importlib)",
            inert=(None, "custom_reward_manager")),
    *_reward_model_rows("reward.reward_model"),
    Moved("reward.reward_model.model_path", "reward_model.model.path", "verlx's key of the reward model's checkpoint",
          current=True),
    Moved("reward.reward_model.enable", "reward_model.enable", "verlx's reward model section", current=True),
    Refused("reward.sandbox_fusion", SANDBOX, switch="reward.sandbox_fusion.url"),
    Refused("sandbox_fusion", SANDBOX, switch="sandbox_fusion.url"),
    Refused("reward_model.sandbox_fusion", SANDBOX, switch="reward_model.sandbox_fusion.url"),
    *_reward_model_rows("reward_model"),
    Ignored("reward_model.model.use_fused_kernels", "fused log-prob kernels are the policy's; the reward model "
            "computes one score per sequence"),
    Refused("reward_model.model.fsdp_config.fsdp_size", "a sharding group size of the reward model's own (it "
            "shards over every training GPU)", inert=(None, -1)),
    Ignored("reward_model.model.fsdp_config.forward_prefetch", "a prefetch hint of veRL's FSDP1 worker; verlx's "
            "reward model shards with FSDP2, one layer at a time"),
    Ignored("reward_model.use_reward_loop", "veRL picks one of its two reward-model paths (an inference server, or "
            "an FSDP worker) with it; verlx has one: the reward model's forward pass, sharded with FSDP in the "
            "training workers, which scores a sequence-classification model as either of veRL's does"),
    *[Refused(f"reward_model.{key}", "reward managers imported from a module (reward_loop_source=importlib)",
              inert=(None, "register")) for key in ("reward_loop_source", "reward_loop_module_path",
                                                    "reward_loop_class_name")],
    Refused("reward_model.elliptical", "the rep_exp recipe's elliptical exploration reward",
            switch="reward_model.elliptical.enable"),
    Refused("reward_model.reward_kwargs.elliptical", "the rep_exp recipe's elliptical exploration reward"),
    Refused("reward_manager", "reward managers imported from a module (reward_manager.source=importlib)",
            inert=(None, "register", "naive", "custom_reward_manager")),
]

ALGORITHM = [
    Refused("algorithm.use_pf_ppo", "preference-feedback PPO (use_pf_ppo)"),
    Refused("algorithm.pf_ppo", "preference-feedback PPO (use_pf_ppo)", switch="algorithm.use_pf_ppo"),
    Refused("algorithm.filter_groups.max_inflight_gen_batches", "several generation batches in flight",
            inert=(None, 1)),
]

NPU = "Ascend NPUs (trainer.device=npu)"

TRAINER = [
    Refused("trainer.device", NPU, inert=(None, "auto", "cpu", "cuda")),
    Refused("trainer.checkpoint_callback_class", "checkpoint callbacks", inert=(None,)),
    Ignored("trainer.esi_redundant_time", "for veRL's elastic server instances, which verlx does not manage"),
    Ignored("trainer.ray_wait_register_center_timeout", "verlx's workers need no register center"),
    Ignored("trainer.use_legacy_worker_impl", "verlx has one worker implementation"),
    Ignored("trainer.use_v1", "verlx has one trainer; trainer.rollout_mode picks sync, one_step_off or async"),
    Refused("trainer.v1.trainer_mode", "veRL's v1 asynchronous trainers (verlx: trainer.rollout_mode="
            "one_step_off or async)", inert=(None, "sync")),
    Ignored("trainer.v1", "read only by veRL's v1 asynchronous trainers (trainer.v1.trainer_mode)"),
    Ignored("trainer.tensorboard_dir", "verlx's tensorboard logger writes to <trainer.output_dir>/tensorboard"),
]

RUN_WIDE = [
    *profiler_rows("global_profiler"),
    Ignored("global_profiler.global_tool_config.precision_debugger", "settings of veRL's precision_debugger "
            "profiler, which verlx refuses as global_profiler.tool, naming the tools it has"),
    Refused("transfer_queue", "TransferQueue", switch="transfer_queue.enable"),
    Refused("skip.rollout", "rollout skipping (replaying dumped rollouts)", switch="skip.rollout.enable"),
    Refused("skip.rollout_tq", "rollout skipping (replaying dumped rollouts)", switch="skip.rollout_tq.enable"),
    Refused("skip.async_rollout", "rollout skipping (replaying dumped rollouts)",
            switch="skip.async_rollout.enable"),
    Refused("model_engine", "choosing the engine by a model_engine key (choose it as veRL does on the command line: "
            "model_engine=megatron, or in a defaults list: `- override model_engine: megatron`)", inert=(None, "dp")),
    Moved("actor_rollout_ref.actor.model_engine", "model_engine", "the engine is veRL's config group model_engine; "
          "veRL's examples/README.md and two of its scripts set it under the actor, which veRL's own config lacks"),
    Ignored("**._target_", "veRL's dataclass for the section; verlx builds its own typed config", quiet=True),
    Moved("ray_init", "ray_kwargs.ray_init", "veRL moved ray.init's options under ray_kwargs"),
    Alias("actor_rollout_ref.actor.ppo_micro_batch_size",
          _GLOBAL_MICRO.format(new="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu")),
    Alias("critic.ppo_micro_batch_size", _GLOBAL_MICRO.format(new="critic.ppo_micro_batch_size_per_gpu")),
    Alias("critic.forward_micro_batch_size", _GLOBAL_MICRO.format(new="critic.forward_micro_batch_size_per_gpu")),
    Alias("actor_rollout_ref.ref.log_prob_micro_batch_size",
          _GLOBAL_MICRO.format(new="actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu")),
    Alias("reward_model.micro_batch_size", _GLOBAL_MICRO.format(new="reward_model.micro_batch_size_per_gpu")),
]

ROWS = DATA + REWARD + ALGORITHM + TRAINER + RUN_WIDE
