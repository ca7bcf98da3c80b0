"""`python -m verlx.trainer.main_ppo key=value ...`: validate the config, build data and rewards, start Ray, train.

Everything that can be wrong with the input is checked here, before Ray starts or any GPU time is spent. `prepare`
is the one place the driver resolves the config (hub model paths, veRL's keys folded onto verlx's, the engine
`auto` names, the total training steps); nothing changes it afterwards.
"""

from __future__ import annotations

import logging

from verlx.config.loader import ConfigError
from verlx.config.schema import PPOConfig
from verlx.reward.managers import RewardFailure
from verlx.single_controller.errors import WorkerDiedError, WorkerGroupError
from verlx.trainer.entrypoint import hydra_command
from verlx.trainer.preflight import uses_critic_if_known, validate
from verlx.trainer.ray_startup import start_ray, use_gpus
from verlx.trainer.resume import NothingToDo, stop_if_finished
from verlx.trainer.verl_mappings import apply_verl_mappings

logger = logging.getLogger("verlx")


def check_engine_capabilities(config: PPOConfig, resolved_name: str) -> None:
    """What the run needs of the engine `auto` resolved to (validate checked an engine named in the config)."""
    from verlx.rollout.capabilities import capability_problems

    problems = capability_problems(config, resolved_name)
    if problems:
        raise ConfigError(problems)


def resolve_hub_models(config: PPOConfig) -> None:
    """Hub ids ("Qwen/Qwen2.5-0.5B-Instruct") in the model paths become local snapshot directories, once, here."""
    from verlx.config.hf_paths import resolve_model_paths

    sections = [("actor_rollout_ref.model", config.actor_rollout_ref.model)]
    if uses_critic_if_known(config):
        sections.append(("critic.model", config.critic.model))
    fields = [(f"{key}.{attribute}", section, attribute) for key, section in sections
              for attribute in ("path", "tokenizer_path")]
    if config.reward_model.enable:
        fields += [(f"reward_model.model.{attribute}", config.reward_model.model, attribute)
                   for attribute in ("path", "input_tokenizer")]
    resolve_model_paths(fields)


def prepare(config: PPOConfig):
    """Checks and builds everything the driver needs; no Ray, no GPU."""
    from verlx.data import build_dataloaders
    from verlx.reward.managers import build_reward_manager
    from verlx.rollout.base import resolve_engine_name
    from verlx.utils.tracking import check_loggers
    from verlx.workers.tokenizer import load_tokenizer

    use_gpu = use_gpus(config)
    resolve_hub_models(config)
    validate(config)
    for note in apply_verl_mappings(config):  # veRL keys served by verlx features of other names, said once
        logger.info(note)
    rollout = config.actor_rollout_ref.rollout
    configured, rollout.name = rollout.name, resolve_engine_name(rollout.name)
    if configured == "auto":
        check_engine_capabilities(config, rollout.name)
    check_loggers(config.trainer.loggers)
    model = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code, model.custom_chat_template,
                               "actor_rollout_ref.model." + ("tokenizer_path" if model.tokenizer_path else "path"))
    train_loader, val_loader = build_dataloaders(config, tokenizer)
    config.trainer.total_training_steps = total_training_steps(config, train_loader)
    check_agent_data(config, tokenizer, train_loader, val_loader)
    reward_fn = build_reward_manager(config, tokenizer)
    return use_gpu, tokenizer, train_loader, val_loader, reward_fn


def total_training_steps(config: PPOConfig, train_loader) -> int:
    """trainer.total_training_steps, or the loader's batches per epoch times trainer.total_epochs when it is null."""
    t = config.trainer
    per_epoch = len(train_loader)
    if per_epoch == 0:
        raise ConfigError([f"the training set yields no batch of data.train_batch_size={config.data.train_batch_size} "
                           f"prompts ({len(train_loader.dataset)} rows); lower the batch size or add data"])
    return per_epoch * t.total_epochs if t.total_training_steps is None else t.total_training_steps


def check_agent_data(config: PPOConfig, tokenizer, train_loader, val_loader) -> None:
    """Multi-turn: the data's agent loops exist and their prompts fit with the tools' schemas (rc 2 otherwise)."""
    from verlx.rollout.agent.config_checks import agent_data_problems

    problems = agent_data_problems(config, tokenizer, train_loader.dataset, "data.train_files")
    if val_loader is not None:
        problems += agent_data_problems(config, tokenizer, val_loader.dataset, "data.val_files")
    if problems:
        raise ConfigError(problems)


def run_ppo(config: PPOConfig) -> dict[str, float]:
    """Train; the checkpoint to resume from is picked, verified and compared with this config before Ray starts."""
    from verlx.trainer.ppo_trainer import RayPPOTrainer

    use_gpu, tokenizer, train_loader, val_loader, reward_fn = prepare(config)
    try:
        trainer = RayPPOTrainer(config, tokenizer, train_loader, val_loader, reward_fn, reward_fn, use_gpu)
        if stop_if_finished(trainer.plan_resume(), config.trainer, trainer.total_steps):
            return {}
        start_ray(config, use_gpu)
        return _train_with_restarts(trainer, config)
    finally:
        reward_fn.close()


def _train_with_restarts(trainer, config: PPOConfig) -> dict[str, float]:
    restarts = 0
    try:
        while True:
            try:
                trainer.init_workers()
                return trainer.fit()
            except WorkerDiedError as e:
                if restarts >= config.trainer.max_restarts:
                    raise
                restarts += 1
                logger.error("%s\nrestarting the workers (%d of trainer.max_restarts=%d) and resuming from the "
                             "newest intact checkpoint", e, restarts, config.trainer.max_restarts)
                trainer.prepare_restart()
    finally:
        trainer.shutdown()


def _run_failures() -> tuple[type[BaseException], ...]:
    """Failures reported as one message (exit 1) instead of a traceback."""
    from verlx.trainer.invariants import InvariantError
    from verlx.trainer.rollout_modes.pipeline import RolloutStalled
    from verlx.trainer.rollout_modes.staleness import StalenessError

    return WorkerGroupError, RewardFailure, NothingToDo, InvariantError, RolloutStalled, StalenessError


main = hydra_command("ppo_trainer", PPOConfig, run_ppo, failures=_run_failures())

if __name__ == "__main__":
    main()
