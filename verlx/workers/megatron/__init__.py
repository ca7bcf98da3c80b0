"""The megatron-core training backend: actor, reference and critic with tensor, pipeline and context parallelism.

Importing this package does not import megatron-core; modules that need it call `require_megatron_core()` first so
a missing install fails with the command that fixes it.
"""

from __future__ import annotations

import importlib.util

from verlx.utils.errors import InputError

INSTALL_COMMAND = "pip install 'verlx[megatron]'"


class MegatronNotInstalled(InputError, ImportError):
    """megatron-core is needed for strategy=megatron and is not importable."""


def megatron_core_available() -> bool:
    return importlib.util.find_spec("megatron") is not None and importlib.util.find_spec("megatron.core") is not None


def require_megatron_core(key: str = "actor_rollout_ref.actor.strategy") -> None:
    if not megatron_core_available():
        raise MegatronNotInstalled(
            f"{key}=megatron needs megatron-core, which is not installed; install it with: {INSTALL_COMMAND} "
            "(transformer-engine is optional: without it the pure-torch layers are used)"
        )


def transformer_engine_available() -> bool:
    return importlib.util.find_spec("transformer_engine") is not None
