"""Tokenizer loading and the token ids that end a response."""

from __future__ import annotations

import logging
import os

from verlx.utils.paths import expand_path

logger = logging.getLogger(__name__)


def load_tokenizer(path: str, trust_remote_code: bool = False, custom_chat_template: str | None = None):
    """AutoTokenizer with a pad token (the eos token when the model has none) and an optional chat template."""
    from transformers import AutoTokenizer

    path = os.path.expanduser(path)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise RuntimeError(f"could not load a tokenizer from {path!r}: {e}") from e
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning("tokenizer at %s has no pad token; using the eos token %r", path, tokenizer.eos_token)
    if custom_chat_template is not None:
        tokenizer.chat_template = custom_chat_template
    return tokenizer


def stop_token_ids(tokenizer, model_path: str, trust_remote_code: bool = False) -> list[int]:
    """generation_config.eos_token_id (an int or a list; the first ends the assistant turn) when the model has one,
    else the tokenizer's eos id."""
    from transformers import GenerationConfig

    ids: list[int] = []
    try:
        config = GenerationConfig.from_pretrained(expand_path(model_path), trust_remote_code=trust_remote_code)
        eos = config.eos_token_id
        ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos] if eos is not None else [])]
    except (OSError, ValueError):
        pass
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    if not ids:
        raise ValueError(f"no eos token: neither {model_path}/generation_config.json nor the tokenizer define one")
    return ids
