"""Driver-side checkpoint directories: written under a temporary name, listed in a manifest, marked complete, then
renamed.

A crash or a full disk during a save leaves the previous `global_step_N` untouched. Before a resume trusts a
checkpoint its files are checked against its manifest (checkpoint_manifest.py); `resume_mode=auto` walks back from
the newest directory to the newest intact one, naming what is wrong with each one it skips.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import time

import torch

from verlx.config.loader import ConfigError
from verlx.single_controller.errors import WorkerCallError
from verlx.trainer.checkpoint_manifest import has_manifest, verify_manifest, write_manifest
from verlx.utils.errors import StorageError, is_storage_error
from verlx.utils.paths import expand_path

logger = logging.getLogger(__name__)

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
    return [s for s in _step_dirs(root) if os.path.exists(os.path.join(step_dir(root, s), COMPLETE))]


def _step_dirs(root: str) -> list[int]:
    if not os.path.isdir(root):
        return []
    return sorted(int(m.group(1)) for name in os.listdir(root) if (m := STEP_DIR.match(name)))


def checkpoint_damage(path: str) -> str | None:
    """What is wrong with the checkpoint at `path`, or None when its files are those its save wrote."""
    if not os.path.isdir(path):
        return "the directory does not exist"
    problems = [] if os.path.exists(os.path.join(path, COMPLETE)) else [
        f"no {COMPLETE} marker (its save did not finish)"]
    if has_manifest(path):
        damage = verify_manifest(path)
        problems += [str(damage)] if damage else []
    else:
        critic = os.path.isdir(os.path.join(path, "critic"))
        missing = [f for f in missing_files(path, use_critic=critic) if f != COMPLETE]
        problems += ["missing: " + ", ".join(missing)] if missing else []
        if not problems:
            logger.warning("%s was written before checkpoints had a manifest: only the presence of its main files "
                           "was checked, not their sizes or contents", path)
    return "; ".join(problems) or None


def newest_intact(root: str) -> str | None:
    """The newest checkpoint under `root` whose files check out; None when there is none at all. Each damaged one
    skipped on the way is named with its problem; if all are damaged that is an error (starting from scratch would
    overwrite them)."""
    damaged = []
    for step in reversed(_step_dirs(root)):
        path = step_dir(root, step)
        problem = checkpoint_damage(path)
        if problem is None:
            if damaged:
                logger.warning("resuming from %s, the newest intact checkpoint", path)
            return path
        logger.warning("checkpoint %s is damaged and is skipped: %s", path, problem)
        damaged.append(f"{path}: {problem}")
    if damaged:
        raise ConfigError([f"trainer.resume_mode=auto: no intact checkpoint in trainer.default_local_dir={root}; "
                           + "; ".join(damaged) + ". Restore the files, or start fresh with "
                           "trainer.resume_mode=disable (its saves replace those directories)"])
    return None


def resolve_resume_path(trainer_cfg, mode: str | None = None) -> str | None:
    """The checkpoint to resume from, verified, or None; an explicit path that is missing or damaged is an error.
    `mode` overrides trainer.resume_mode."""
    mode = mode or trainer_cfg.resume_mode
    if mode == "disable":
        return None
    if mode == "auto":
        return newest_intact(expand_path(trainer_cfg.default_local_dir, absolute=True))
    path = expand_path(trainer_cfg.resume_from_path, absolute=True)
    problem = checkpoint_damage(path)
    if problem is not None:
        raise ConfigError([f"trainer.resume_from_path={trainer_cfg.resume_from_path}: cannot resume from {path}: "
                           f"{problem}. Restore those files, or resume from another checkpoint "
                           "(trainer.resume_mode=auto picks the newest intact one in trainer.default_local_dir)"])
    return path


def last_checkpoint_sentence(root: str) -> str:
    """Where a resumed run would continue: the newest complete checkpoint under `root`, or the beginning."""
    steps = complete_steps(root)
    if steps:
        return (f"The last complete checkpoint is {step_dir(root, steps[-1])} (step {steps[-1]}); running the same "
                "command again resumes from it.")
    return (f"No checkpoint is complete in trainer.default_local_dir={root} yet; running the same command again "
            "starts from the beginning.")


@contextlib.contextmanager
def save_errors(root: str, tmp_dir: str):
    """A save that fails for lack of space or another OS error (in the driver or in a worker) ends the run with a
    StorageError naming the path, the OS error, the free space and the checkpoint that resuming would use; the
    unfinished directory keeps its temporary name, so it is never taken as a checkpoint."""
    remedy = (f"{last_checkpoint_sentence(root)} The unfinished save {tmp_dir} is not a checkpoint (resume ignores "
              "it and the next run deletes it). Free space, or point trainer.default_local_dir at another disk")
    try:
        yield
    except WorkerCallError as e:
        if not isinstance(e.__cause__, StorageError):
            raise
        raise StorageError(f"{e.__cause__} {remedy}.") from e
    except StorageError as e:
        raise StorageError(f"{e} {remedy}.") from e
    except Exception as e:
        if not is_storage_error(e):
            raise
        raise StorageError.writing("the checkpoint", tmp_dir, e, remedy) from e


def write_driver_state(tmp_dir: str, state: dict, config_dict: dict) -> None:
    torch.save(state, os.path.join(tmp_dir, "data.pt"))
    with open(os.path.join(tmp_dir, "config.json"), "w") as f:
        json.dump(config_dict, f, indent=1, default=str)


def read_driver_state(path: str) -> dict:
    return torch.load(os.path.join(path, "data.pt"), weights_only=False)


def finalize(tmp_dir: str, root: str, step: int, use_critic: bool) -> str:
    """Check every file is there, list them in the manifest, mark complete, rename into place, update the latest
    pointer."""
    missing = [f for f in missing_files(tmp_dir, use_critic) if f != COMPLETE]
    if missing:
        raise RuntimeError(f"checkpoint for step {step} is incomplete (missing {missing}); nothing was replaced")
    write_manifest(tmp_dir, skip=(COMPLETE,))
    with open(os.path.join(tmp_dir, COMPLETE), "w") as f:
        f.write(f"{step}\n")
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


def prune(root: str, keep: int | None, newest: int) -> list[int]:
    """Keep the `keep` newest complete checkpoints up to step `newest` (the one just saved), delete older ones;
    returns the removed steps. Checkpoints past `newest` (left by an earlier run: a damaged one that was skipped,
    or newer ones than an explicit resume_from_path) are not counted, so the one just saved is never deleted."""
    if not keep or keep <= 0:
        return []
    steps = [s for s in complete_steps(root) if s <= newest]
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
