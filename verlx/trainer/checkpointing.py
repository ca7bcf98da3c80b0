"""Driver-side checkpoint directories: written under a temporary name, marked complete, then renamed.

A crash or a full disk during a save leaves the previous `global_step_N` untouched, and `resume_mode=auto`
only ever picks a directory that holds the COMPLETE marker.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time

import torch

STEP_DIR = re.compile(r"^global_step_(\d+)$")
COMPLETE = "COMPLETE"
LATEST = "latest_checkpointed_iteration.txt"


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def temp_step_dir(root: str, step: int) -> str:
    return os.path.join(root, f".tmp-global_step_{step}-{os.getpid()}-{int(time.time())}")


def required_files(use_critic: bool) -> list[str]:
    files = [COMPLETE, "data.pt", "actor/dcp/.metadata", "actor/extra_rank0.pt"]
    if use_critic:
        files += ["critic/dcp/.metadata", "critic/extra_rank0.pt"]
    return files


def missing_files(path: str, use_critic: bool) -> list[str]:
    return [f for f in required_files(use_critic) if not os.path.exists(os.path.join(path, f))]


def complete_steps(root: str) -> list[int]:
    if not os.path.isdir(root):
        return []
    steps = []
    for name in os.listdir(root):
        m = STEP_DIR.match(name)
        if m and os.path.exists(os.path.join(root, name, COMPLETE)):
            steps.append(int(m.group(1)))
    return sorted(steps)


def resolve_resume_path(trainer_cfg, use_critic: bool) -> str | None:
    """The checkpoint to resume from, or None; an explicit path that is missing or incomplete is an error."""
    root = os.path.expanduser(trainer_cfg.default_local_dir)
    if trainer_cfg.resume_mode == "disable":
        return None
    if trainer_cfg.resume_mode == "auto":
        steps = complete_steps(root)
        return step_dir(root, steps[-1]) if steps else None
    path = os.path.expanduser(trainer_cfg.resume_from_path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"trainer.resume_from_path={trainer_cfg.resume_from_path!r} does not exist")
    missing = missing_files(path, use_critic)
    if missing:
        raise FileNotFoundError(
            f"trainer.resume_from_path={path!r} is not a complete checkpoint; missing: {', '.join(missing)}"
        )
    return path


def write_driver_state(tmp_dir: str, state: dict, config_dict: dict) -> None:
    torch.save(state, os.path.join(tmp_dir, "data.pt"))
    with open(os.path.join(tmp_dir, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=1, default=str)


def read_driver_state(path: str) -> dict:
    return torch.load(os.path.join(path, "data.pt"), weights_only=False)


def finalize(tmp_dir: str, root: str, step: int, use_critic: bool) -> str:
    """Check every file is there, mark complete, rename into place, update the latest pointer."""
    with open(os.path.join(tmp_dir, COMPLETE), "w") as f:
        f.write(f"{step}\n")
    missing = missing_files(tmp_dir, use_critic)
    if missing:
        raise RuntimeError(f"checkpoint for step {step} is incomplete (missing {missing}); nothing was replaced")
    final = step_dir(root, step)
    if os.path.exists(final):
        stale = final + f".old-{os.getpid()}"
        os.rename(final, stale)
        os.rename(tmp_dir, final)
        shutil.rmtree(stale, ignore_errors=True)
    else:
        os.rename(tmp_dir, final)
    latest_tmp = os.path.join(root, f".{LATEST}.tmp")
    with open(latest_tmp, "w") as f:
        f.write(str(step))
    os.replace(latest_tmp, os.path.join(root, LATEST))
    return final


def prune(root: str, keep: int | None) -> list[int]:
    """Delete the oldest complete checkpoints beyond `keep`; returns the removed steps."""
    if not keep or keep <= 0:
        return []
    steps = complete_steps(root)
    removed = steps[:-keep]
    for s in removed:
        shutil.rmtree(step_dir(root, s), ignore_errors=True)
    return removed


def remove_stale_temps(root: str) -> None:
    """Temporary directories left by a crashed save are garbage: nothing ever reads them."""
    if os.path.isdir(root):
        for name in os.listdir(root):
            if name.startswith(".tmp-global_step_"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)


# Keys whose change makes a checkpoint unusable: the saved shards or optimizer state no longer fit.
_BREAKING_KEYS = (
    "actor_rollout_ref.actor.strategy",
    "actor_rollout_ref.model.lora_rank",
    "actor_rollout_ref.model.target_modules",
    "actor_rollout_ref.actor.optim.optimizer",
    "critic.strategy",
)
_ARCHITECTURE_KEYS = ("architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
                      "num_key_value_heads", "intermediate_size", "vocab_size", "tie_word_embeddings")


def _lookup(tree: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def resume_incompatibilities(path: str, config_dict: dict, hf_config) -> list[str]:
    """What changed between the checkpoint at `path` and this run in a way that breaks resuming from it."""
    problems = []
    saved_path = os.path.join(path, "config.json")
    if os.path.exists(saved_path):
        with open(saved_path) as f:
            saved = json.load(f)
        for key in _BREAKING_KEYS:
            before, now = _lookup(saved, key), _lookup(config_dict, key)
            if before != now:
                problems.append(f"{key} was {before!r} when the checkpoint was saved and is {now!r} now")
    hf_path = os.path.join(path, "actor", "huggingface", "config.json")
    if os.path.exists(hf_path) and hf_config is not None:
        with open(hf_path) as f:
            saved_hf = json.load(f)
        for key in _ARCHITECTURE_KEYS:
            before, now = saved_hf.get(key), getattr(hf_config, key, None)
            if before is not None and before != now:
                problems.append(f"model config {key} was {before!r} in the checkpoint and is {now!r} in "
                                f"actor_rollout_ref.model.path")
    return problems
