"""The shared shape of verlx's `python -m ...` commands: Hydra composition as veRL users use it, typed config,
clean errors.

Hydra's flags (--cfg job, --info, -m, ...) are told from overrides by Hydra's own argument parser. A relative
`--config-path` is a script's own config directory (or, as in veRL's scripts, `config` for the trainer's own
configs); a script's YAML whose defaults list names ppo_trainer finds verlx's. The overrides go through the veRL
compatibility table (verlx.config.verl_compat) before Hydra reads them, and the composed config once more (keys a
script's YAML sets): moved keys are renamed, ignored ones dropped with a warning, and refused or unknown keys fail
naming where they were set, before Hydra prints (--cfg job) or anything runs. The errors a user can act on are
reported once, by verlx.utils.errors.reported_errors: a message without a traceback (VERLX_DEBUG=1: in full);
config and data errors exit with 2, training failures with 1, a signal with 128 + its number.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

import hydra
from omegaconf import DictConfig

from verlx.config.loader import CONFIG_DIR, build
from verlx.config.verl_compat.compose import apply_table, compose_dict, hydra_overrides, resolve_config_dir
from verlx.trainer.stop_signals import stop_at_once
from verlx.utils.errors import debug_enabled, reported_errors

# Flags after which Hydra only prints something about itself: nothing is composed first.
INFORMATION_FLAGS = ("--help", "--hydra-help", "--version", "--info", "--shell-completion")


def split_command_line(argv: list[str]) -> tuple[list[str], list[str]]:
    """(Hydra's flags, the key=value overrides) of a command line, read by Hydra's own argument parser.

    The flags come back in a canonical form (`-c job` as `--cfg job`), so that flags and overrides may be written
    in any order and the overrides can be rewritten before Hydra reads the command line again.
    """
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()
    args = parser.parse_intermixed_args(argv)
    flags = []
    for action in parser._actions:
        value = getattr(args, action.dest, None)
        if not action.option_strings or value is None or value == action.default:
            continue
        flags += [action.option_strings[0]] if action.nargs == 0 else [action.option_strings[0], str(value)]
    return flags, list(args.overrides)


def override_args(argv: list[str]) -> list[str]:
    """The key=value overrides of a command line, without Hydra's flags and their values."""
    return split_command_line(argv)[1]


def _flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


def _with_flag(flags: list[str], name: str, value: str) -> list[str]:
    if name in flags:
        i = flags.index(name)
        return [*flags[:i], name, value, *flags[i + 2:]]
    return [*flags, name, value]


def print_job_config(composed: dict, package: str | None, resolve: bool) -> None:
    """`--cfg job` as Hydra prints it, of the config verlx will run: after the compatibility table (veRL keys in
    verlx's places, ignored ones gone)."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(composed)
    if package:
        cfg = OmegaConf.create({"_": OmegaConf.select(cfg, package)})["_"]
        print(f"# @package {package}")
    if resolve:
        OmegaConf.resolve(cfg)
    print(OmegaConf.to_yaml(cfg))


def hydra_command(config_name: str, schema: type, run: Callable, stopped: str = "") -> Callable[[], None]:
    """A `main()` that composes `config_name` (or --config-name), builds `schema` from it and calls `run(config)`.
    A stop signal ends it at once with 'stopped on SIGTERM' + `stopped` (what an interrupted run leaves); main_ppo's
    and the SFT trainer's loops install their own handlers, which save first."""
    state: dict = {}

    @hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base=None)
    def _hydra_main(cfg: DictConfig) -> None:
        with reported_errors():  # inside Hydra's task: it would print a traceback of anything that escapes
            with stop_at_once(stopped):
                container, report = apply_table(cfg, schema, state["overrides"], state["config_dir"])
                if state["multirun"]:
                    report.log()  # a sweep's jobs differ: each one says what the table did
                run(build(schema, container))

    def main() -> None:
        flags, overrides = split_command_line(sys.argv[1:])
        information = any(f in flags for f in INFORMATION_FLAGS)
        if debug_enabled():
            os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # VERLX_DEBUG=1: every traceback in full
        if "--info" not in flags:  # Hydra prints --info through logging, with its own handler
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        with reported_errors():
            if not information:
                name = _flag(flags, "--config-name") or config_name
                config_dir = resolve_config_dir(_flag(flags, "--config-path"), name)
                state.update(overrides=overrides, config_dir=config_dir, multirun="--multirun" in flags)
                if not state["multirun"]:  # every problem before Hydra prints or anything runs
                    composed, report = compose_dict(name, overrides, schema, config_dir, resolve=False)
                    report.log()
                    if _flag(flags, "--cfg") == "job":
                        print_job_config(composed, _flag(flags, "--package"), "--resolve" in flags)
                        return
                overrides, _ = hydra_overrides(overrides, schema, config_dir)
                flags = _with_flag(flags, "--config-path", config_dir)
            sys.argv = [sys.argv[0], *flags, *overrides]
            _hydra_main()

    return main
