"""The shared shape of verlx's `python -m ...` commands: Hydra composition, typed config, clean errors.

Override keys are checked against the typed schema before Hydra runs (so a typo gets a did-you-mean rather than
Hydra's bare "not in struct"), the composed config becomes the schema's dataclass, and the errors a user can act on
are printed without a traceback: config errors exit with 2, training failures with 1.
"""

from __future__ import annotations

import logging
import sys
from typing import Callable

import hydra
from omegaconf import DictConfig

from verlx.config.loader import CONFIG_DIR, ConfigError, build, check_override_keys, to_container

# Hydra's own flags that take the next argument as their value (e.g. --config-name ppo_megatron_trainer).
_FLAGS_WITH_VALUE = ("--config-name", "-cn", "--config-path", "-cp", "--config-dir", "-cd")


def override_args(argv: list[str]) -> list[str]:
    """The key=value overrides of a command line, without Hydra's flags and their values."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _FLAGS_WITH_VALUE:
            skip = True
        elif not arg.startswith("-"):
            out.append(arg)
    return out


def hydra_command(config_name: str, schema: type, run: Callable, failures: tuple[type[BaseException], ...] = ()
                  ) -> Callable[[], None]:
    """A `main()` that composes `config_name`, builds `schema` from it and calls `run(config)`."""

    @hydra.main(config_path=CONFIG_DIR, config_name=config_name, version_base=None)
    def _hydra_main(cfg: DictConfig) -> None:
        try:
            run(build(schema, to_container(cfg)))
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
        except failures as e:
            print(f"error: {type(e).__name__}: {e}", file=sys.stderr)
            raise SystemExit(1) from None

    def main() -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            check_override_keys(override_args(sys.argv[1:]), config_name, schema)
            _hydra_main()
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            sys.exit(2)

    return main
