"""The HF config of a model directory, with the user's overrides, and the user library that registers its class."""

from __future__ import annotations

import importlib

from verlx.utils.paths import expand_path


def import_external_lib(name: str | None) -> None:
    """model.external_lib: a module whose import registers a custom architecture with transformers."""
    if name:
        importlib.import_module(name)


def load_hf_config(path: str, trust_remote_code: bool, override_config: dict):
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(expand_path(path), trust_remote_code=trust_remote_code)
    except Exception as e:
        raise RuntimeError(f"could not load the model config from {path!r}: {e}") from e
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    return config
