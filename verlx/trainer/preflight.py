"""Pre-flight checks of a PPO config, run before Ray starts: names, batch arithmetic, paths, unsupported combinations.

Every problem names the keys and values involved and what would work; all problems are reported at once. They live
in the trainer, not in config/, because they consult the registries, models and files of the layers below.
"""

from __future__ import annotations

import logging
import os
from types import SimpleNamespace

from verlx.algorithms.advantages import uses_critic
from verlx.config.loader import ConfigError, Findings
from verlx.config.ranges import PPO_RANGES, range_problems
from verlx.config.roles import ROLLOUT_DTYPES
from verlx.config.run import RESUME_MODES
from verlx.config.schema import PPOConfig
from verlx.models.checkpoint_config import read_checkpoint_config
from verlx.models.weight_files import model_dir_problems
from verlx.trainer.learning_checks import check_learning
from verlx.utils.batch_sizes import (
    budget_too_small,
    dynamic_batches,
    micro_batch_token_limit,
    per_gpu_micro_batch_size,
    ppo_batch_sizes,
    sequence_split_size,
)
from verlx.utils.paths import expand_path

logger = logging.getLogger(__name__)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _near(values: list[int], target: int, k: int = 4) -> str:
    return ", ".join(str(v) for v in sorted(values, key=lambda v: (abs(v - target), v))[:k])


def _registered(f: Findings, key: str, value: str, registry) -> None:
    try:
        registry.get(value)
    except KeyError as e:
        f.problems.append(f"{key}: {e}")


def world_size_of(cfg: PPOConfig) -> int:
    return cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node


def check_names(cfg: PPOConfig, f: Findings) -> None:
    """Every name the config picks from a registry (or a schema enumeration) is one that exists."""
    from verlx.algorithms.advantages import ADV_ESTIMATORS
    from verlx.algorithms.core import LOSS_AGG_MODES
    from verlx.algorithms.kl import KL_CONTROLLERS, KL_PENALTIES
    from verlx.algorithms.policy_losses import POLICY_LOSSES
    from verlx.data.rl_dataset import PROMPT_TRUNCATIONS
    from verlx.reward.managers import REWARD_MANAGERS
    from verlx.rollout.base import ROLLOUT_ENGINES
    from verlx.utils.lr_schedules import LR_SCHEDULES
    from verlx.workers.engine import TRAINING_ENGINES
    from verlx.workers.megatron.schedule import fsdp_problems as megatron_optim_keys_on_fsdp

    a, arr = cfg.algorithm, cfg.actor_rollout_ref
    _registered(f, "algorithm.adv_estimator", a.adv_estimator, ADV_ESTIMATORS)
    _registered(f, "actor_rollout_ref.actor.policy_loss.loss_mode", arr.actor.policy_loss.loss_mode, POLICY_LOSSES)
    _registered(f, "algorithm.kl_penalty", a.kl_penalty, KL_PENALTIES)
    _registered(f, "actor_rollout_ref.actor.kl_loss_type", arr.actor.kl_loss_type, KL_PENALTIES)
    _registered(f, "algorithm.kl_ctrl.type", a.kl_ctrl.type, KL_CONTROLLERS)
    _registered(f, "reward_model.reward_manager", cfg.reward_model.reward_manager, REWARD_MANAGERS)
    f.choice("actor_rollout_ref.actor.loss_agg_mode", arr.actor.loss_agg_mode, LOSS_AGG_MODES)
    f.choice("critic.loss_agg_mode", cfg.critic.loss_agg_mode, LOSS_AGG_MODES)
    if arr.rollout.name != "auto" and ":" not in arr.rollout.name:
        _registered(f, "actor_rollout_ref.rollout.name", arr.rollout.name, ROLLOUT_ENGINES)
    f.choice("actor_rollout_ref.actor.strategy", arr.actor.strategy, TRAINING_ENGINES.names())
    f.choice("critic.strategy", cfg.critic.strategy, TRAINING_ENGINES.names())
    f.choice("data.truncation", cfg.data.truncation, ["error", *PROMPT_TRUNCATIONS.names()])
    f.choice("trainer.resume_mode", cfg.trainer.resume_mode, RESUME_MODES)
    f.choice("actor_rollout_ref.rollout.dtype", arr.rollout.dtype, ROLLOUT_DTYPES)
    for key, fsdp in (("actor_rollout_ref.actor", arr.actor.fsdp_config),
                      ("critic.model", cfg.critic.model.fsdp_config)):
        f.choice(f"{key}.fsdp_config.reduce_dtype", fsdp.reduce_dtype, ROLLOUT_DTYPES)
    for key, role in (("actor_rollout_ref.actor.optim", arr.actor), ("critic.optim", cfg.critic)):
        optim = role.optim
        f.choice(f"{key}.lr_scheduler_type", optim.warmup_style or optim.lr_scheduler_type, LR_SCHEDULES.names())
        f.choice(f"{key}.optimizer", optim.optimizer, ("AdamW",))
        if role.strategy == "fsdp":
            f.problems += megatron_optim_keys_on_fsdp(key, optim)


def check_batch_arithmetic(cfg: PPOConfig, f: Findings, world_size: int) -> None:
    """veRL semantics: mini-batch sizes count prompts; micro-batch sizes count samples per GPU."""
    arr, data = cfg.actor_rollout_ref, cfg.data
    n = arr.rollout.n
    train = data.train_batch_size
    f.require(train > 0, f"data.train_batch_size={train} must be positive")
    f.require(n >= 1, f"actor_rollout_ref.rollout.n={n} must be >= 1")
    if train <= 0 or n < 1:
        return
    samples = train * n
    if not f.require(
        samples % world_size == 0,
        f"data.train_batch_size × rollout.n = {train}×{n} = {samples} samples do not split evenly over "
        f"{world_size} workers (trainer.nnodes × trainer.n_gpus_per_node); pick a train_batch_size that makes "
        f"{train}×{n} a multiple of {world_size}",
    ):
        return
    roles = [("actor_rollout_ref.actor", arr.actor, _ranks_per_shard(arr.actor))]
    if uses_critic(cfg):
        roles.append(("critic", cfg.critic, _ranks_per_shard(cfg.critic)))
    for key, role, sp in roles:
        mini = role.ppo_mini_batch_size
        if not f.require(mini > 0, f"{key}.ppo_mini_batch_size={mini} must be positive"):
            continue
        if not f.require(
            train % mini == 0,
            f"data.train_batch_size={train} is not a multiple of {key}.ppo_mini_batch_size={mini}; "
            f"mini-batch sizes that work: {_near(_divisors(train), mini)}",
        ):
            continue
        if not f.require(
            sp >= 1 and world_size % sp == 0,
            f"{key}: its {sp} GPUs per data-parallel shard (ulysses_sequence_parallel_size, or the megatron "
            f"parallel sizes multiplied) must divide the world size {world_size}",
        ):
            continue
        dp = world_size // sp
        mini_samples = mini * n
        if not f.require(
            mini_samples % dp == 0,
            f"{key}.ppo_mini_batch_size × rollout.n = {mini}×{n} = {mini_samples} samples do not split over "
            f"{dp} data-parallel ranks; choose ppo_mini_batch_size so that {mini}×{n} is a multiple of {dp}",
        ):
            continue
        sizes = ppo_batch_sizes(role, n, dp)
        per_gpu, micro = sizes.mini, sizes.micro
        if dynamic_batches(role.use_dynamic_bsz, micro):
            continue
        if micro is None:
            f.problems.append(
                f"{key}.ppo_micro_batch_size_per_gpu is not set (and use_dynamic_bsz is false); each GPU gets "
                f"{per_gpu} samples per mini-batch, so micro-batch sizes that work are {_near(_divisors(per_gpu), 4)}"
            )
            continue
        f.require(
            micro > 0 and per_gpu % micro == 0,
            f"{key}.ppo_micro_batch_size_per_gpu={micro} does not divide the {per_gpu} samples each GPU gets per "
            f"mini-batch ({key}.ppo_mini_batch_size={mini} × rollout.n={n} / {dp} ranks); "
            f"values that work: {_near(_divisors(per_gpu), micro)}",
        )
    log_prob_roles = [("actor_rollout_ref.rollout", arr.rollout.log_prob_micro_batch_size,
                       arr.rollout.log_prob_micro_batch_size_per_gpu, arr.rollout.log_prob_use_dynamic_bsz)]
    if cfg.uses_ref_log_prob_settings:
        log_prob_roles.append(("actor_rollout_ref.ref", arr.ref.log_prob_micro_batch_size,
                               arr.ref.log_prob_micro_batch_size_per_gpu, arr.ref.log_prob_use_dynamic_bsz))
    for key, global_micro, per_gpu_micro, dynamic in log_prob_roles:
        micro = per_gpu_micro_batch_size(per_gpu_micro, global_micro, world_size)
        if dynamic_batches(dynamic, micro):
            continue
        f.require(
            micro is not None and micro > 0,
            f"{key}.log_prob_micro_batch_size_per_gpu is not set (and log_prob_use_dynamic_bsz is false); "
            "set it to the samples per log-prob forward pass on each GPU, e.g. 8",
        )
    check_rollout_tp(cfg, f, world_size)
    if data.val_batch_size is not None:
        f.require(data.val_batch_size > 0, f"data.val_batch_size={data.val_batch_size} must be positive or null")


def check_rollout_tp(cfg: PPOConfig, f: Findings, world_size: int) -> None:
    """The rollout engines' TP groups tile the processes that host them (the trainer's, or the rollout group's)
    and either fit inside a node or span whole nodes: the check the workers' engine layout would fail later."""
    from verlx.rollout.engine_layout import check_tp_size

    tp, t = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size, cfg.trainer
    if not cfg.actor_rollout_ref.hybrid_engine:
        world_size = cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node
    try:
        check_tp_size(world_size, tp, t.n_gpus_per_node)
    except ValueError as e:
        f.problems.append(str(e))


def _ranks_per_shard(role) -> int:
    """GPUs that share one data-parallel shard: Ulysses group (FSDP) or TP × PP × CP (megatron)."""
    if role.strategy == "megatron":
        from verlx.workers.megatron.config_checks import model_parallel_size

        return model_parallel_size(role)
    return role.ulysses_sequence_parallel_size


def check_algorithm(cfg: PPOConfig, f: Findings) -> None:
    from verlx.algorithms.advantages import estimator_needs_critic, estimator_needs_groups, estimator_problems
    from verlx.algorithms.policy_losses import policy_loss_problems

    a, arr = cfg.algorithm, cfg.actor_rollout_ref
    f.problems += estimator_problems(cfg) + policy_loss_problems(cfg)
    try:
        needs_critic = estimator_needs_critic(a.adv_estimator)
        needs_groups = estimator_needs_groups(a.adv_estimator)
    except KeyError:
        return  # reported by check_names
    if needs_critic and cfg.critic.enable is False:
        f.problems.append(
            f"algorithm.adv_estimator={a.adv_estimator} needs a critic but critic.enable=false; "
            "remove critic.enable or pick a critic-free estimator such as grpo"
        )
    if needs_groups and arr.rollout.n == 1:
        f.warnings.append(
            f"algorithm.adv_estimator={a.adv_estimator} with actor_rollout_ref.rollout.n=1: every group has one "
            "sample, so every advantage is 0 and the policy will not learn; set rollout.n to 2 or more"
        )
    actor = arr.actor
    f.require(actor.clip_ratio_c > 1.0, f"actor_rollout_ref.actor.clip_ratio_c={actor.clip_ratio_c} must be > 1")
    f.require(actor.clip_low >= 0, f"actor clip_ratio_low={actor.clip_low} must be >= 0 (1 or more: no lower "
              "clip, as in veRL: the ratio is never below 1 - clip_ratio_low <= 0)")
    f.require(actor.clip_high >= 0, f"actor clip_ratio_high={actor.clip_high} must be >= 0")
    f.require(not a.filter_groups.enable or bool(a.filter_groups.metric),
              "algorithm.filter_groups.enable=true needs algorithm.filter_groups.metric (score, seq_reward, "
              "seq_final_reward, or a key of the reward function's extra info)")
    r = arr.rollout
    f.require(r.temperature >= 0, f"actor_rollout_ref.rollout.temperature={r.temperature} must be >= 0")
    f.require(0 < r.top_p <= 1, f"actor_rollout_ref.rollout.top_p={r.top_p} must be in (0, 1]")
    f.require(r.val_kwargs.n >= 1, f"actor_rollout_ref.rollout.val_kwargs.n={r.val_kwargs.n} must be >= 1")
    f.require(0 < r.gpu_memory_utilization <= 1,
              f"actor_rollout_ref.rollout.gpu_memory_utilization={r.gpu_memory_utilization} must be in (0, 1]")
    check_loss_scale_factor(cfg, f)


def check_loss_scale_factor(cfg: PPOConfig, f: Findings) -> None:
    """loss_scale_factor divides only seq-mean-token-sum-norm's losses (as in veRL, which ignores it otherwise):
    set with another mode it changes nothing, which is said rather than passed over. The critic inherits the
    actor's value, so it is named only where it was set on its own."""
    actor, critic = cfg.actor_rollout_ref.actor, cfg.critic
    roles = [("actor_rollout_ref.actor", actor)]
    if uses_critic_if_known(cfg) and critic.loss_scale_factor != actor.loss_scale_factor:
        roles.append(("critic", critic))
    for key, role in roles:
        if role.loss_scale_factor is not None and role.loss_agg_mode != "seq-mean-token-sum-norm":
            f.warnings.append(
                f"{key}.loss_scale_factor={role.loss_scale_factor} has no effect with {key}.loss_agg_mode="
                f"{role.loss_agg_mode}: it divides seq-mean-token-sum-norm's sequence sums only; set loss_agg_mode="
                "seq-mean-token-sum-norm or remove it")


def check_unsupported(cfg: PPOConfig, f: Findings) -> None:
    t = cfg.trainer
    f.require(t.default_hdfs_dir is None, "trainer.default_hdfs_dir: HDFS upload is not supported; set it to null")
    for key, ckpt in (("actor_rollout_ref.actor", cfg.actor_rollout_ref.actor.checkpoint),
                      ("critic", cfg.critic.checkpoint)):
        f.require(not ckpt.async_save, f"{key}.checkpoint.async_save=true is not supported yet; set it to false")
    f.choice("trainer.device", t.device, ("auto", "cpu", "cuda"))
    f.require(t.nnodes >= 1 and t.n_gpus_per_node >= 1,
              f"trainer.nnodes={t.nnodes} and trainer.n_gpus_per_node={t.n_gpus_per_node} must be >= 1")
    if t.resume_mode == "resume_path":
        f.require(t.resume_from_path is not None,
                  "trainer.resume_mode=resume_path needs trainer.resume_from_path (a global_step_N directory)")
    model = cfg.actor_rollout_ref.model
    if model.lora_rank > 0:
        from verlx.models.lora import INSTALL_HINT, peft_available

        f.require(peft_available(), f"actor_rollout_ref.model.lora_rank={model.lora_rank} needs the peft package: "
                  f"{INSTALL_HINT}")
        f.require(cfg.actor_rollout_ref.actor.strategy in ("fsdp", "fsdp2"),
                  f"actor_rollout_ref.model.lora_rank={model.lora_rank} with actor_rollout_ref.actor.strategy="
                  f"{cfg.actor_rollout_ref.actor.strategy}: verlx does not support megatron LoRA yet (its LoRA is "
                  "PEFT on the fsdp strategy)")
    loggers = t.loggers
    from verlx.utils.tracking import LOGGERS

    for name in loggers:
        _registered(f, "trainer.logger", name, LOGGERS)


def check_run_length(cfg: PPOConfig, f: Findings) -> None:
    """Only null means "from the epochs": a 0 that silently became a full run of total_epochs was a trap."""
    t = cfg.trainer
    if t.total_training_steps is not None:
        f.require(t.total_training_steps > 0,
                  f"trainer.total_training_steps={t.total_training_steps} must be positive; use null to train for "
                  f"trainer.total_epochs ({t.total_epochs}), or trainer.val_only=true to only validate")
    else:
        f.require(t.total_epochs > 0, f"trainer.total_epochs={t.total_epochs} must be positive when "
                  "trainer.total_training_steps is null")


def _model_head_counts(path: str | None) -> SimpleNamespace | None:
    """num_attention_heads / num_key_value_heads from the model's config.json, when it exists and has them."""
    raw = read_checkpoint_config(path)
    if raw is None or not isinstance(raw.get("num_attention_heads"), int):
        return None
    return SimpleNamespace(num_attention_heads=raw["num_attention_heads"],
                           num_key_value_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"])


def check_sequence_parallel(cfg: PPOConfig, f: Findings, world_size: int) -> None:
    """Ulysses SP > 1 needs packed sequences, one size for the actor and its reference (they share workers), and a
    size the model's attention heads can be split by (read from config.json when present, the distillation
    teacher's too; the world size is checked with the batch arithmetic)."""
    from verlx.models.ulysses import check_ulysses

    arr = cfg.actor_rollout_ref
    if cfg.use_reference and arr.ref.strategy != "megatron" and (
            arr.ref.ulysses_sequence_parallel_size != arr.actor.ulysses_sequence_parallel_size):
        f.problems.append(
            f"actor_rollout_ref.ref.ulysses_sequence_parallel_size={arr.ref.ulysses_sequence_parallel_size} differs "
            f"from actor_rollout_ref.actor.ulysses_sequence_parallel_size={arr.actor.ulysses_sequence_parallel_size}; "
            "the reference runs in the actor's workers and needs the same size")
    roles = [("actor_rollout_ref.actor", arr.actor, arr.model.use_remove_padding, "actor_rollout_ref.model",
              arr.model.path)]
    if uses_critic(cfg):
        roles.append(("critic", cfg.critic, cfg.critic.model.use_remove_padding, "critic.model",
                      cfg.critic.model.path or arr.model.path))
    if cfg.distillation.enabled and cfg.distillation.teacher.model_path:  # the teacher shares the actor's SP groups
        roles.append(("actor_rollout_ref.actor", arr.actor, arr.model.use_remove_padding, "actor_rollout_ref.model",
                      cfg.distillation.teacher.model_path))
    for key, role, packed, model_key, path in roles:
        sp = role.ulysses_sequence_parallel_size
        if role.strategy == "megatron" or sp <= 1:
            continue
        f.require(packed, f"{key}.ulysses_sequence_parallel_size={sp} needs {model_key}.use_remove_padding=true "
                  "(Ulysses splits one packed row of real tokens over the GPUs)")
        heads = _model_head_counts(path)
        if heads is None or world_size % sp:
            continue
        try:
            check_ulysses(heads, sp, world_size, f"{key}.ulysses_sequence_parallel_size")
        except ValueError as e:
            f.problems.append(f"{e} (from {path}/config.json)")


def check_token_budgets(cfg: PPOConfig, f: Findings) -> None:
    """Every token budget of a dynamic-batch phase must let a micro-batch hold the longest sequence the data and
    rollout allow. The budgets are per GPU, as in veRL: under sequence parallelism a micro-batch holds budget × the
    group's size tokens (utils.batch_sizes.sequence_split_size; the reference's runs on the actor's workers).

    An error, not a warning: a prompt of max_prompt_length with a response cut at max_response_length is an
    ordinary event in RL, so the run would fail at the first such sample, hours in, with the same message. A null
    budget is derived by the workers, which check it the same way (workers/memory_plan).
    """
    from verlx.workers.auto_settings import dynamic_phases

    data = cfg.data
    longest = data.max_prompt_length + data.max_response_length
    for key, budget, dynamic in dynamic_phases(cfg):
        split = sequence_split_size(cfg.critic if key.startswith("critic.") else cfg.actor_rollout_ref.actor)
        if not dynamic or budget is None or micro_batch_token_limit(budget, split) >= longest:
            continue
        f.problems.append(budget_too_small(
            key, budget, split, longest, f"the longest possible sequence, data.max_prompt_length + "
            f"data.max_response_length = {data.max_prompt_length} + {data.max_response_length} = {longest} tokens"))


def check_paths(cfg: PPOConfig, f: Findings) -> None:
    d = cfg.data
    files = [("data.train_files", p) for p in ([d.train_files] if isinstance(d.train_files, str) else d.train_files)]
    if d.val_files is not None:
        files += [("data.val_files", p) for p in ([d.val_files] if isinstance(d.val_files, str) else d.val_files)]
    for key, path in files:
        f.require(os.path.isfile(expand_path(path)), _data_file_problem(key, path))
    model = cfg.actor_rollout_ref.model
    model_dir = expand_path(model.path)
    if f.require(os.path.isdir(model_dir), f"actor_rollout_ref.model.path: directory {model.path!r} does not exist "
                 "(give a local HF model directory, or a hub id such as Qwen/Qwen2.5-0.5B-Instruct)"):
        f.require(os.path.isfile(os.path.join(model_dir, "config.json")),
                  f"actor_rollout_ref.model.path: {model.path!r} has no config.json; "
                  "is it a HuggingFace model directory?")
    teacher = cfg.distillation.teacher.model_path if cfg.distillation.enabled else None
    if teacher is not None:
        f.require(os.path.isdir(expand_path(teacher)), f"{cfg.distillation.teacher_key_prefix}.model_path: "
                  f"directory {teacher!r} does not exist (give the teacher's local HF model directory)")
    for key, path in _model_dirs(cfg):
        f.problems += model_dir_problems(path, key)
    crf = cfg.custom_reward_function
    if crf.path is not None:
        f.require(os.path.isfile(expand_path(crf.path)),
                  f"custom_reward_function.path: file {crf.path!r} does not exist")
    if uses_critic_if_known(cfg) and cfg.critic.model.path is not None:
        f.require(os.path.isdir(expand_path(cfg.critic.model.path)),
                  f"critic.model.path: directory {cfg.critic.model.path!r} does not exist")


def _data_file_problem(key: str, path: str) -> str:
    directory = expand_path(path)
    if os.path.isdir(directory):
        files = sorted(n for n in os.listdir(directory) if n.endswith(".parquet"))
        role = "train" if key == "data.train_files" else "test"
        example = os.path.join(path, next((n for n in files if role in n), files[0] if files else f"{role}.parquet"))
        inside = ", ".join(files[:4]) or "it has none"
        return (f"{key}: {path!r} is a directory; give the parquet file(s) in it ({inside}), e.g. {key}={example}, or "
                "a list [a.parquet,b.parquet]")
    return (f"{key}: file {path!r} does not exist; run a script in examples/data_preprocess/ to create it or fix the "
            "path")


def _model_dirs(cfg: PPOConfig) -> list[tuple[str, str]]:
    """(key, directory) of each model this run loads, where the directory exists."""
    dirs = [("actor_rollout_ref.model.path", cfg.actor_rollout_ref.model.path)]
    if uses_critic_if_known(cfg) and cfg.critic.model.path is not None:
        dirs.append(("critic.model.path", cfg.critic.model.path))
    if cfg.reward_model.enable and cfg.reward_model.model.path is not None:
        dirs.append(("reward_model.model.path", cfg.reward_model.model.path))
    if cfg.distillation.enabled and cfg.distillation.teacher.model_path is not None:
        dirs.append((f"{cfg.distillation.teacher_key_prefix}.model_path", cfg.distillation.teacher.model_path))
    return [(key, expand_path(path)) for key, path in dirs if path and os.path.isdir(expand_path(path))]


def check_verl_features(cfg: PPOConfig, f: Findings, world_size: int, check_files: bool) -> None:
    """The reward model, DAPO's reward_kwargs, gen_batch_size, custom_cls, sampler, distillation and the profiler
    keys."""
    from verlx.data.config_checks import check_data_features
    from verlx.trainer.distillation_checks import check_distillation
    from verlx.trainer.reward_checks import check_rewards
    from verlx.workers.profile_plan import check_profiler

    check_rewards(cfg, f, world_size, check_files)
    check_distillation(cfg, f)
    check_data_features(cfg, f, world_size, check_files)
    check_profiler(cfg, f, world_size)


def uses_critic_if_known(cfg: PPOConfig) -> bool:
    """uses_critic(cfg), False for an unknown algorithm.adv_estimator (which check_names reports)."""
    try:
        return uses_critic(cfg)
    except KeyError:
        return False


def validate(cfg: PPOConfig, world_size: int | None = None, check_files: bool = True) -> list[str]:
    """Raise ConfigError with every problem found; return the warnings (also logged)."""
    f = Findings()
    f.problems += range_problems(cfg, PPO_RANGES)
    check_names(cfg, f)
    check_unsupported(cfg, f)
    check_run_length(cfg, f)
    if not f.problems:
        from verlx.trainer.vision_checks import patch_size_findings, vision_problems

        f.problems += vision_problems(cfg)  # before the engines' checks, which do not know vision-language models
        problems, warnings = patch_size_findings(cfg)
        f.problems += problems
        f.warnings += warnings
    if not f.problems:
        from verlx.workers.megatron.config_checks import megatron_findings

        megatron = megatron_findings(cfg, world_size or world_size_of(cfg))
        f.problems += megatron.problems
        f.warnings += megatron.warnings
    if not f.problems:
        from verlx.rollout.agent.config_checks import agent_loop_findings
        from verlx.rollout.capabilities import capability_problems, model_config_problems
        from verlx.trainer.rollout_modes.config_checks import rollout_mode_problems

        agent = agent_loop_findings(cfg)
        f.problems += agent.problems
        f.warnings += agent.warnings
        f.problems += rollout_mode_problems(cfg)
        f.problems += capability_problems(cfg)
        f.problems += model_config_problems(cfg)
    if not f.problems:
        check_verl_features(cfg, f, world_size or world_size_of(cfg), check_files)
    if not f.problems:
        check_algorithm(cfg, f)
        check_learning(cfg, f)
        check_batch_arithmetic(cfg, f, world_size or world_size_of(cfg))
        check_sequence_parallel(cfg, f, world_size or world_size_of(cfg))
        check_token_budgets(cfg, f)
    if not f.problems:
        from verlx.workers.auto_settings import memory_problems

        f.problems += memory_problems(cfg, world_size or world_size_of(cfg))
    if check_files:
        check_paths(cfg, f)
    if f.problems:
        raise ConfigError(f.problems)
    for w in f.warnings:
        logger.warning(w)
    return f.warnings
