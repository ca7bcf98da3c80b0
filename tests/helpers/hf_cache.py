"""A Hugging Face cache on disk (the layout huggingface_hub writes), holding a local model under a hub id."""

from __future__ import annotations

import os
import shutil

REVISION = "0123456789abcdef0123456789abcdef01234567"


def cache_model(cache_dir, repo_id: str, model_dir) -> str:
    """Put `model_dir`'s files into `cache_dir` as the main revision of `repo_id`; return the snapshot directory."""
    repo = os.path.join(cache_dir, "models--" + repo_id.replace("/", "--"))
    snapshot = os.path.join(repo, "snapshots", REVISION)
    shutil.copytree(model_dir, snapshot)
    os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
    with open(os.path.join(repo, "refs", "main"), "w") as f:
        f.write(REVISION)
    return snapshot


def offline_env(cache_dir) -> dict[str, str]:
    """Environment of a process that must find hub models in `cache_dir` only, never on the network."""
    return {"HF_HUB_CACHE": str(cache_dir), "HF_HUB_OFFLINE": "1", "HF_HOME": os.path.join(str(cache_dir), "home")}
