"""A model directory's config.json read as plain JSON, before Ray and without transformers: the checks that must
run in milliseconds (head counts, the model type, the longest context the engines will accept)."""

from __future__ import annotations

import json
import os


def read_checkpoint_config(path: str | None) -> dict | None:
    """The parsed config.json of model directory `path`, None when there is none or it cannot be read (the path
    checks report unreadable configs; a hub id has no local file until it is downloaded)."""
    if not path:
        return None
    config_file = os.path.join(os.path.expanduser(os.path.expandvars(path)), "config.json")
    try:
        with open(config_file, encoding="utf-8") as f:
            raw = json.load(f)
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) else None


def text_config(raw: dict) -> dict:
    """The decoder's section: vision-language configs keep it under text_config (transformers 5 only there)."""
    nested = raw.get("text_config")
    return {**raw, **nested} if isinstance(nested, dict) else raw


def position_limit(raw: dict) -> int | None:
    """max_position_embeddings of the decoder, None when absent or when RoPE scaling stretches it (the engines then
    derive a longer limit themselves)."""
    decoder = text_config(raw)
    limit = decoder.get("max_position_embeddings")
    if not isinstance(limit, (int, float)) or isinstance(limit, bool):
        return None
    for key in ("rope_scaling", "rope_parameters"):
        scaling = decoder.get(key)
        if isinstance(scaling, dict) and scaling.get("factor") not in (None, 1, 1.0):
            return None
    return int(limit)
