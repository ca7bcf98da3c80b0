"""`python -m verlx.trainer.main_generation_server key=value ...`: veRL's main_generation_server command line on
verlx's batch generation (verlx.trainer.main_generation).

veRL's main_generation_server composes ppo_trainer, starts standalone rollout servers and sends every prompt of
data.train_files (data.prompt_key) actor_rollout_ref.rollout.n times, then writes the rows plus a `responses`
column to data.output_path (a key its scripts add with `+`). verlx does the same job with its batch generation:
the same engines, as Ray workers rather than HTTP servers. The keys map as follows: data.train_files → data.path,
actor_rollout_ref.rollout.n → data.n_samples, actor_rollout_ref.model.* → model.*, actor_rollout_ref.rollout.* →
rollout.* (loading its own weights, as nothing trains beside it), trainer.* and ray_kwargs.* as they are.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections.abc import Sequence

from verlx.config.generation import (
    GenerationConfig,
    GenerationDataConfig,
    GenerationModelConfig,
    GenerationTrainerConfig,
)
from verlx.config.loader import CONFIG_DIR
from verlx.config.schema import PPOConfig
from verlx.config.verl_compat.apply import OVERRIDE

logger = logging.getLogger("verlx")
OUTPUT_KEY = "data.output_path"


def split_output_path(overrides: Sequence[str]) -> tuple[list[str], str | None]:
    """(the other overrides, data.output_path): the one key of the command line that ppo_trainer lacks."""
    rest, output = [], None
    for override in overrides:
        match = OVERRIDE.match(override)
        if match and match.group(2) == OUTPUT_KEY and match.group(3):
            output = match.group(3)[1:].strip("'\"") or None
        else:
            rest.append(override)
    return rest, output


def load_server_config(config_name: str, overrides: Sequence[str], config_dir: str = CONFIG_DIR
                       ) -> tuple[PPOConfig, str | None]:
    """The ppo_trainer config of the command line (the compatibility table applied) and data.output_path."""
    from verlx.config.verl_compat.compose import compose_config

    rest, output = split_output_path(overrides)
    return compose_config(config_name, rest, PPOConfig, config_dir), output


def generation_config(ppo: PPOConfig, output_path: str | None) -> GenerationConfig:
    """What main_generation runs for veRL's main_generation_server keys."""
    d, m, r = ppo.data, ppo.actor_rollout_ref.model, ppo.actor_rollout_ref.rollout
    data = GenerationDataConfig(path=d.train_files, prompt_key=d.prompt_key, n_samples=r.n, output_path=output_path,
                                max_samples=d.train_max_samples, truncation=d.truncation,
                                apply_chat_template_kwargs=dict(d.apply_chat_template_kwargs))
    model = GenerationModelConfig(path=m.path, tokenizer_path=m.tokenizer_path, trust_remote_code=m.trust_remote_code,
                                  external_lib=m.external_lib, override_config=dict(m.override_config),
                                  custom_chat_template=m.custom_chat_template)
    rollout = dataclasses.replace(r, n=1, load_format="auto", free_cache_engine=False, calculate_log_probs=False,
                                  log_prob_use_dynamic_bsz=None, log_prob_max_token_len_per_gpu=None)
    t = ppo.trainer
    trainer = GenerationTrainerConfig(nnodes=t.nnodes, n_gpus_per_node=t.n_gpus_per_node, device=t.device,
                                      phase_timeout_s=t.phase_timeout_s)
    return GenerationConfig(data=data, model=model, rollout=rollout, trainer=trainer, ray_kwargs=ppo.ray_kwargs)


def main() -> None:
    from verlx.trainer.entrypoint import split_command_line
    from verlx.trainer.main_generation import run_generation
    from verlx.utils.errors import reported_errors

    flags, overrides = split_command_line(sys.argv[1:])
    usage = ("usage: python -m verlx.trainer.main_generation_server actor_rollout_ref.model.path=MODEL "
             "data.train_files=PROMPTS.parquet +data.output_path=OUT.parquet [key=value ...]")
    if "--help" in flags:
        print(f"{__doc__.strip()}\n\n{usage}")
        return
    if not overrides:
        print(f"error: no model or prompts given\n{usage}", file=sys.stderr)
        sys.exit(2)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from verlx.config.verl_compat.compose import resolve_config_dir

    name = next((flags[i + 1] for i, f in enumerate(flags) if f == "--config-name"), "ppo_trainer")
    path = next((flags[i + 1] for i, f in enumerate(flags) if f == "--config-path"), None)
    with reported_errors():
        ppo, output = load_server_config(name, overrides, resolve_config_dir(path, name))
        config = generation_config(ppo, output)
        if "--cfg" in flags:  # what would run, as main_generation's keys
            from omegaconf import OmegaConf

            print(OmegaConf.to_yaml(dataclasses.asdict(config)))
            return
        run_generation(config)


if __name__ == "__main__":
    main()
