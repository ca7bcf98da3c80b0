"""`python -m verlx.trainer.main_ppo key=value ...`: validate the config, build data and rewards, start Ray, train.

Everything that can be wrong with the input is checked here, before Ray starts or any GPU time is spent.
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


def check_greedy_baseline(config: PPOConfig) -> None:
    """REMAX's baseline is a greedy response: the chosen engine must be able to decode greedily."""
    from verlx.algorithms.advantages import estimator_needs_greedy_baseline
    from verlx.rollout.base import get_engine_class

    name = config.actor_rollout_ref.rollout.name
    if estimator_needs_greedy_baseline(config.algorithm.adv_estimator) and not get_engine_class(name).supports_greedy:
        raise ConfigError([f"algorithm.adv_estimator={config.algorithm.adv_estimator} needs greedy decoding for its "
                           f"baseline, which actor_rollout_ref.rollout.name={name} cannot do; use native or hf"])


def resolve_hub_models(config: PPOConfig) -> None:
    """Hub ids ("Qwen/Qwen2.5-0.5B-Instruct") in the model paths become local snapshot directories, once, here."""
    from verlx.utils.hf_paths import resolve_model_paths

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
    rollout.name = resolve_engine_name(rollout.name)
    check_greedy_baseline(config)
    check_loggers(config.trainer.loggers)
    model = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code, model.custom_chat_template,
                               "actor_rollout_ref.model." + ("tokenizer_path" if model.tokenizer_path else "path"))
    train_loader, val_loader = build_dataloaders(config, tokenizer)
    check_agent_data(config, tokenizer, train_loader, val_loader)
    reward_fn = build_reward_manager(config, tokenizer)
    return use_gpu, tokenizer, train_loader, val_loader, reward_fn


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
    from verlx.utils.cpu_threads import single_threaded_driver

    single_threaded_driver()  # the driver's small tensor work must not wait on a busy host's cores
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
