"""Where SFT writes models: the final one into trainer.default_local_dir, and every trainer.save_freq steps one into
default_local_dir/global_step_<N> (veRL's layout), of which trainer.max_ckpt_to_keep are kept.

They are Hugging Face model directories (model, tokenizer, generation config), not resumable training states: the
SFT trainer cannot resume, so with trainer.resume_mode=auto (veRL's default, which resumes from the newest
global_step_<N>) a directory that already holds them is refused before training rather than trained over.
"""

from __future__ import annotations

import os
import re
import shutil

from verlx.utils.paths import expand_path

STEP_DIR = re.compile(r"^global_step_(\d+)$")


def step_dir(root: str, step: int) -> str:
    return os.path.join(root, f"global_step_{step}")


def saved_steps(root: str) -> list[int]:
    """The N of every global_step_<N> directory under `root`, oldest first."""
    root = expand_path(root, absolute=True)
    if not os.path.isdir(root):
        return []
    found = (STEP_DIR.match(name) for name in os.listdir(root))
    return sorted(int(m.group(1)) for m in found if m and os.path.isdir(os.path.join(root, m.group(0))))


def keep_newest(root: str, keep: int | None) -> list[str]:
    """Remove all but the newest `keep` global_step_<N> directories (None keeps all); the removed paths."""
    steps = saved_steps(root)
    if keep is None or keep <= 0 or len(steps) <= keep:
        return []
    removed = [step_dir(expand_path(root, absolute=True), s) for s in steps[: len(steps) - keep]]
    for path in removed:
        shutil.rmtree(path, ignore_errors=True)
    return removed


def resume_problem(root: str, resume_mode: str) -> str | None:
    """Why a run must not start over `root`'s saved steps (None when it may)."""
    steps = saved_steps(root)
    if resume_mode != "auto" or not steps:
        return None
    return (f"trainer.default_local_dir={root} holds global_step_{steps[-1]} (trainer.save_freq's models) and "
            "trainer.resume_mode=auto asks to resume from it, as veRL does; verlx's SFT trainer cannot resume. "
            "Set trainer.resume_mode=disable to train from model.partial_pretrain again (overwriting them), or "
            "another trainer.default_local_dir")


def write_atomically(directory: str, write) -> None:
    """write(tmp_dir), then rename it to `directory` (an existing one is moved aside first, then removed; the
    global_step_<N> directories in it move into the new one)."""
    directory = expand_path(directory, absolute=True)
    os.makedirs(os.path.dirname(directory), exist_ok=True)
    tmp, old = f"{directory}.tmp-{os.getpid()}", f"{directory}.old-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    write(tmp)
    if os.path.exists(directory):
        for step in saved_steps(directory):
            os.rename(step_dir(directory, step), step_dir(tmp, step))
        os.rename(directory, old)
    os.rename(tmp, directory)
    shutil.rmtree(old, ignore_errors=True)
