"""`python -m verlx.trainer.main_ppo key=value ...`: validate the config, build data and rewards, start Ray, train.

Everything that can be wrong with the input is checked here, before Ray starts or any GPU time is spent. `prepare`
is the one place the driver resolves the config (hub model paths, veRL's keys folded onto verlx's, the engine
`auto` names, the total training steps); nothing changes it afterwards.
"""

from __future__ import annotations

import contextlib
import logging

from verlx.config.loader import ConfigError
from verlx.config.schema import PPOConfig
from verlx.single_controller.errors import WorkerDiedError
from verlx.trainer.checkpointing import last_checkpoint_sentence
from verlx.trainer.entrypoint import hydra_command
from verlx.trainer.output_dirs import prepare_output_dirs
from verlx.trainer.preflight import uses_critic_if_known, validate
from verlx.trainer.ray_startup import shutdown_ray, start_ray, use_gpus
from verlx.trainer.resume import stop_if_finished
from verlx.trainer.reward_columns import check_reward_columns
from verlx.trainer.run_lock import RunLock
from verlx.trainer.stop_signals import STOP_SIGNALS, Interrupted, StopSignals, signal_name, signals_blocked_in_children
from verlx.trainer.verl_mappings import apply_verl_mappings
from verlx.utils.errors import input_errors
from verlx.utils.paths import expand_path

logger = logging.getLogger("verlx")


def check_engine_capabilities(config: PPOConfig, resolved_name: str) -> None:
    """What the run needs of the engine `auto` resolved to (validate checked an engine named in the config)."""
    from verlx.rollout.capabilities import capability_problems, model_config_problems

    problems = capability_problems(config, resolved_name) + model_config_problems(config, resolved_name)
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
    if config.distillation.enabled:
        fields.append((f"{config.distillation.teacher_key_prefix}.model_path", config.distillation.teacher,
                       "model_path"))
    resolve_model_paths(fields)


def load_processor(config: PPOConfig):
    """The image processor of a vision-language policy (data/vision_prompts.py); None for a text model."""
    from verlx.data.vision_prompts import load_image_prompts
    from verlx.models.hf_config import load_hf_config
    from verlx.models.vision import checkpoint_model_type

    model = config.actor_rollout_ref.model
    if checkpoint_model_type(model.path) is None:
        return None
    hf_config = load_hf_config(model.path, model.trust_remote_code, model.override_config)
    return load_image_prompts(model.path, hf_config, model.trust_remote_code)


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
    prepare_output_dirs(config)
    for note in apply_verl_mappings(config):  # veRL keys served by verlx features of other names, said once
        logger.info(note)
    rollout = config.actor_rollout_ref.rollout
    processor = load_processor(config)
    required = () if processor is None else (
        ("supports_image_input", "supports_server_image_input") if rollout.server.enable else ("supports_image_input",))
    configured, rollout.name = rollout.name, resolve_engine_name(rollout.name, required)
    if configured == "auto":
        check_engine_capabilities(config, rollout.name)
    check_loggers(config.trainer.loggers)
    model = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model.tokenizer_path or model.path, model.trust_remote_code, model.custom_chat_template,
                               "actor_rollout_ref.model." + ("tokenizer_path" if model.tokenizer_path else "path"))
    train_loader, val_loader = build_dataloaders(config, tokenizer, processor)
    config.trainer.total_training_steps = total_training_steps(config, train_loader)
    check_agent_data(config, tokenizer, train_loader, val_loader)
    check_reward_columns(config, train_loader.dataset, val_loader.dataset if val_loader is not None else None)
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
    """Train. Before Ray starts: the input is checked, the output directories are created, the checkpoint directory
    is locked, and the checkpoint to resume from is picked, verified and compared with this config."""
    from verlx.trainer.ppo_trainer import RayPPOTrainer
    from verlx.utils.cpu_threads import single_threaded_driver

    single_threaded_driver()  # the driver's small tensor work must not wait on a busy host's cores
    with input_errors("found checking the input before Ray started"):
        use_gpu, tokenizer, train_loader, val_loader, reward_fn = prepare(config)
    try:
        root = expand_path(config.trainer.default_local_dir, absolute=True)
        with RunLock(root):  # before plan_resume, which deletes unfinished saves
            with input_errors("found checking the input before Ray started"):
                trainer = RayPPOTrainer(config, tokenizer, train_loader, val_loader, reward_fn, reward_fn, use_gpu)
                finished = stop_if_finished(trainer.plan_resume(), config.trainer, trainer.total_steps)
            if finished:
                return {}
            # the handlers after ray.init, which installs its own
            with own_ray(config, use_gpu), stop_signals(config, root) as trainer.stop:
                return _train_with_restarts(trainer, config)
    finally:
        reward_fn.close()


def stop_signals(config: PPOConfig, root: str) -> StopSignals:
    t = config.trainer
    return StopSignals(t.save_on_signal, t.save_on_signal_timeout_s, lambda: last_checkpoint_sentence(root))


@contextlib.contextmanager
def own_ray(config: PPOConfig, use_gpu: bool):
    """Ray for the run; one that this run starts is shut down with it (its processes gone before the exit), and its
    processes do not take the stop signals sent to the whole process group (`timeout`, a closed terminal): the
    driver stops them after its last checkpoint (trainer/stop_signals.py)."""
    import ray

    started = not ray.is_initialized()
    with signals_blocked_in_children(STOP_SIGNALS):
        start_ray(config, use_gpu)
    try:
        yield
    finally:
        if started:
            shutdown_ray()


def _train_with_restarts(trainer, config: PPOConfig) -> dict[str, float]:
    restarts = 0
    try:
        while True:
            try:
                trainer.init_workers()
                return trainer.fit()
            except WorkerDiedError as e:
                if trainer.stop.requested:  # the signal reached the workers too (sent to the process group)
                    raise Interrupted(trainer.stop.signum, f"stopped on {signal_name(trainer.stop.signum)}: the "
                                      f"workers were stopped by it too ({e}), so no checkpoint could be saved. "
                                      f"{trainer.stop.last_checkpoint()}") from None
                if restarts >= config.trainer.max_restarts:
                    raise
                restarts += 1
                logger.error("%s\nrestarting the workers (%d of trainer.max_restarts=%d) and resuming from the "
                             "newest intact checkpoint", e, restarts, config.trainer.max_restarts)
                trainer.prepare_restart()
    finally:
        trainer.shutdown()


main = hydra_command("ppo_trainer", PPOConfig, run_ppo)

if __name__ == "__main__":
    main()
