"""The shared shape of verlx's `python -m ...` commands: Hydra composition, typed config, clean errors.

Hydra's flags (--cfg job, --info, -m, ...) are told from overrides by Hydra's own argument parser. Overrides of
older veRL releases are upgraded with a warning, and override keys are checked against the typed schema before
Hydra runs (so a typo gets a did-you-mean rather than Hydra's bare "not in struct"). The composed config becomes
the schema's dataclass. Errors are reported once, by verlx.utils.errors.reported_errors: a message without a
traceback; config and data errors exit with 2, training failures with 1, a signal with 128 + its number.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable

import hydra
from omegaconf import DictConfig

from verlx.config.loader import CONFIG_DIR, build, check_override_keys, to_container, upgraded_overrides
from verlx.trainer.stop_signals import stop_at_once
from verlx.utils.errors import debug_enabled, reported_errors


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


def hydra_command(config_name: str, schema: type, run: Callable, stopped: str = "") -> Callable[[], None]:
    """A `main()` that composes `config_name`, builds `schema` from it and calls `run(config)`. A stop signal ends it
    at once with 'stopped on SIGTERM' + `stopped` (what an interrupted run leaves); main_ppo's training loop
    installs its own handlers, which save a checkpoint first."""

    @hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base=None)
    def _hydra_main(cfg: DictConfig) -> None:
        with reported_errors():  # inside Hydra's task: it would print a traceback of anything that escapes
            with stop_at_once(stopped):
                run(build(schema, to_container(cfg)))

    def main() -> None:
        flags, overrides = split_command_line(sys.argv[1:])
        if debug_enabled():
            os.environ.setdefault("HYDRA_FULL_ERROR", "1")  # VERLX_DEBUG=1: every traceback in full
        if "--info" not in flags:  # Hydra prints --info through logging, with its own handler
            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        with reported_errors():
            if "--shell-completion" not in flags:  # its "overrides" are commands such as install=bash
                overrides = upgraded_overrides(overrides, schema)
                check_override_keys(overrides, config_name, schema)
            sys.argv = [sys.argv[0], *flags, *overrides]
            _hydra_main()

    return main
