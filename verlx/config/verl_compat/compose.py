"""Compose a config as veRL users do: verlx's YAML or a script's own (whose defaults list names veRL's configs),
Hydra's override grammar, then the compatibility table, then the typed dataclass.

`config_dir` is where the primary config lives: verlx's own (verlx/config) or a script's directory, which then
gets verlx's directory on Hydra's search path, so that `defaults: [ppo_trainer, _self_]` finds verlx's
ppo_trainer.yaml (and config groups such as model_engine=megatron resolve as in veRL).
"""

from __future__ import annotations

import glob
import logging
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from verlx.config.loader import CONFIG_DIR, ConfigError, build, unknown_key_problem
from verlx.config.verl_compat import VERL_VERSION, group_option_problem, group_options, table_for
from verlx.config.verl_compat.apply import Origins, Report, prepare_overrides, translate


def config_groups(*dirs: str) -> list[str]:
    """The config groups (subdirectories holding YAML files) of the config directories."""
    return sorted({name for d in dirs if os.path.isdir(d) for name in os.listdir(d)
                   if glob.glob(os.path.join(d, name, "*.yaml"))})


def search_path_override(overrides: Sequence[str], config_dir: str) -> list[str]:
    """`hydra.searchpath=[verlx's config dir, ...the user's]` when the primary config is not verlx's own."""
    if os.path.abspath(config_dir) == CONFIG_DIR:
        return []
    from hydra.core.override_parser.overrides_parser import OverridesParser

    theirs: list[str] = []
    for override in overrides:
        if override.lstrip("+").startswith("hydra.searchpath="):
            theirs = [str(v) for v in OverridesParser.create().parse_override(override.lstrip("+")).value()]
    entries = ",".join(f"'{p}'" for p in [f"file://{CONFIG_DIR}", *theirs])
    return [f"hydra.searchpath=[{entries}]"]


def user_yaml_files(config_dir: str) -> list[str]:
    """The YAML files of a script's own config directory (to name the file and line of a key it sets)."""
    if os.path.abspath(config_dir) == CONFIG_DIR:
        return []
    return sorted(glob.glob(os.path.join(config_dir, "*.yaml")) + glob.glob(os.path.join(config_dir, "*.yml")))


def unknown_message(schema: type) -> Callable[[str], str]:
    def message(key: str) -> str:
        problem = (unknown_key_problem(schema, key.split(".")) or f"unknown key '{key}'.").rstrip(". ")
        end = " " if problem.endswith("?") else ". "  # a did-you-mean question ends its own sentence
        return (f"{problem}{end}It is no key of verlx, nor of veRL {VERL_VERSION}, the release verlx's "
                "compatibility table covers (docs/verl_compat.md)")

    return message


def compose_dict(config_name: str, overrides: Sequence[str], schema: type, config_dir: str = CONFIG_DIR,
                 resolve: bool = True) -> tuple[dict, Report]:
    """The composed config as a plain dict with the table applied (interpolations resolved unless `resolve` is
    false), and its report. Raises ConfigError with every problem: refused and unknown keys, each with where it
    was set."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    config_dir = os.path.abspath(config_dir)
    prepared, report = hydra_overrides(overrides, schema, config_dir)
    try:
        with initialize_config_dir(config_dir=config_dir, version_base=None):
            cfg = compose(config_name=config_name, overrides=prepared)
    except (HydraException, OmegaConfBaseException) as e:
        raise ConfigError([explain_hydra_error(e, config_name, config_dir)]) from None
    container, found = apply_table(cfg, schema, overrides, config_dir, resolve)
    report.extend(found)
    return container, report


def hydra_overrides(overrides: Sequence[str], schema: type, config_dir: str) -> tuple[list[str], Report]:
    """The overrides as Hydra gets them (the table's renames, drops and prefixes; verlx's config directory on the
    search path of a script's own), and the report of what changed."""
    prepared, report = prepare_overrides(overrides, schema, table_for(schema), config_groups(CONFIG_DIR, config_dir),
                                         group_options(schema))
    if report.problems:
        raise ConfigError(report.problems)
    return prepared + search_path_override(overrides, config_dir), report


def apply_table(cfg, schema: type, overrides: Sequence[str], config_dir: str, resolve: bool = True
                ) -> tuple[dict, Report]:
    """Hydra's composed config → a plain dict with the table applied (interpolations resolved unless `resolve` is
    false); raises ConfigError naming every refused or unknown key and where it was set."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    def resolved(key: str, default: Any) -> Any:
        try:
            value = OmegaConf.select(cfg, key, default=default)
        except OmegaConfBaseException:
            return default
        return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value

    raw = OmegaConf.to_container(cfg, resolve=False)
    raw.pop("hydra", None)
    origins = Origins(overrides, user_yaml_files(config_dir))
    translated, report = translate(raw, schema, table_for(schema), origins, resolved, unknown_message(schema))
    if report.problems:
        raise ConfigError(report.problems)
    try:
        container = OmegaConf.to_container(OmegaConf.create(translated), resolve=True)
    except OmegaConfBaseException as e:
        raise ConfigError([interpolation_problem(e, origins)]) from None
    for rule in VALUE_RULES.get(schema.__name__, ()):
        rule(container, report)
        rule(translated, report)
    return (container if resolve else translated), report


def gen_batch_without_dynamic_sampling(config: dict, report: Report) -> None:
    """veRL's trainer loads data.gen_batch_size prompts per step and, without DAPO's dynamic sampling, trains on
    all of them: data.train_batch_size is then read as data.gen_batch_size."""
    data = config.get("data") or {}
    gen, train = data.get("gen_batch_size"), data.get("train_batch_size")
    dynamic = ((config.get("algorithm") or {}).get("filter_groups") or {}).get("enable")
    if isinstance(gen, int) and isinstance(train, int) and gen != train and dynamic is False:
        data["train_batch_size"] = gen
        report.note(logging.INFO, f"data.gen_batch_size={gen} without algorithm.filter_groups.enable: veRL trains on "
                    f"every prompt it generates, so data.train_batch_size={train} is read as {gen}")


VALUE_RULES: dict[str, tuple[Callable[[dict, Report], None], ...]] = {
    "PPOConfig": (gen_batch_without_dynamic_sampling,)}


def compose_config(config_name: str, overrides: Sequence[str], schema: type, config_dir: str = CONFIG_DIR,
                   log: bool = True):
    """compose_dict, built into `schema`; what the table did is logged once (unless `log` is false)."""
    container, report = compose_dict(config_name, overrides, schema, config_dir)
    if log:
        report.log()
    return build(schema, container)


def resolve_config_dir(config_path: str | None, config_name: str) -> str:
    """The directory of the primary config. A relative --config-path is read from the working directory (the
    script's own config directory) when the config is there; `--config-path=config` as veRL scripts write it for
    veRL's own configs (ppo_trainer, ppo_megatron_trainer, ...) is verlx's config directory."""
    if config_path is None:
        return CONFIG_DIR
    candidate = os.path.abspath(os.path.expanduser(config_path))
    if _has_config(candidate, config_name) or not _has_config(CONFIG_DIR, config_name):
        if not os.path.isdir(candidate):
            raise ConfigError([f"--config-path={config_path}: there is no directory {candidate}, and verlx has no "
                               f"config named '{config_name}' of its own"])
        return candidate
    return CONFIG_DIR


def _has_config(directory: str, name: str) -> bool:
    return os.path.isfile(os.path.join(directory, name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"))


def interpolation_problem(error, origins: Origins) -> str:
    key = getattr(error, "full_key", "") or ""
    missing = re.search(r"Interpolation key '([^']+)' not found", str(error))
    written = origins.written(f"${{{missing.group(1)}}}") if missing else ""
    where = written or (origins.where(key) if key else "")
    at = f" (written at {where})" if where else ""
    return (f"{key or 'the config'}: {getattr(error, 'msg', error)}{at}; an interpolation ${{...}} names a key "
            "that verlx's config does not have")


# Config groups of veRL's own ppo_trainer.yaml; verlx's ppo_trainer.yaml writes these sections itself.
VERL_GROUPS = ("actor", "ref", "critic", "data", "model", "reward", "reward_model", "reward_manager", "algorithm",
               "distillation", "transfer_queue", "engine", "optim", "profiler", "npu_profile")
GROUP_IN_ERROR = re.compile(r"Could not find '(?P<group>[\w/]+?)/(?P<option>\w+)'|config group '(?P<bare>\w+)'")


def explain_hydra_error(error: Exception, config_name: str, config_dir: str) -> str:
    """Hydra's own error, with what verlx knows about it (a veRL config group option verlx lacks or composes
    otherwise, a missing config, or the override Hydra could not read)."""
    text = str(error).strip()
    refusal = group_option_problem(text)
    if refusal:
        return refusal
    match = GROUP_IN_ERROR.search(text)
    group = match and (match.group("group") or match.group("bare"))
    if group in VERL_GROUPS:
        shadows = [os.path.join(config_dir, f) for f in sorted(os.listdir(config_dir))
                   if config_dir != CONFIG_DIR and os.path.isfile(os.path.join(CONFIG_DIR, f)) and f.endswith(".yaml")]
        hint = (f" {', '.join(shadows)} hides verlx's config of the same name (a copy of veRL's own?): remove it."
                if shadows else "")
        return (f"{text}\n'{group}' is a config group of veRL's own ppo_trainer.yaml; verlx's ppo_trainer.yaml "
                "composes those sections itself, so a defaults list names ppo_trainer or ppo_megatron_trainer "
                f"(and model_engine=dp|megatron) instead.{hint}")
    if "Could not find" in text or "Cannot find primary config" in text:
        names = sorted(f[:-5] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))
        return (f"{text}\nverlx composes '{config_name}' from {config_dir}"
                f"{'' if config_dir == CONFIG_DIR else f' and {CONFIG_DIR}'}; verlx's own configs are {names} "
                f"and its config groups {config_groups(CONFIG_DIR)}")
    return f"Hydra could not compose the config: {text}"
