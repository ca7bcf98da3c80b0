"""No `python -m verlx.…` command exits 0 without doing its job: each module with a `__main__` block, run with no
arguments and with --help, either fails (a message, no traceback) or prints what it is for."""

from __future__ import annotations

import os
import re

import pytest

from helpers.commands import REPO_DIR, assert_no_traceback, run_module

MAIN_BLOCK = re.compile(r'^if __name__ == "__main__":', re.M)
# Modules whose run without arguments is their whole job and takes minutes (checked with --help only).
LONG_JOB_WITHOUT_ARGUMENTS = {"verlx.quickstart": "trains the quick start's model end to end"}


def entry_modules() -> list[str]:
    found = []
    for directory, _, files in os.walk(os.path.join(REPO_DIR, "verlx")):
        for name in files:
            path = os.path.join(directory, name)
            if name.endswith(".py"):
                with open(path) as f:
                    if MAIN_BLOCK.search(f.read()):
                        found.append(os.path.relpath(path, REPO_DIR)[:-3].replace(os.sep, ".").removesuffix(
                            ".__main__").removesuffix(".__init__"))
    return sorted(found)


def test_the_discovery_finds_the_trainers_entry_points():
    modules = entry_modules()
    for module in ("verlx.trainer.main_ppo", "verlx.trainer.fsdp_sft_trainer", "verlx.trainer.sft_trainer",
                   "verlx.trainer.main_generation_server", "verlx.config.verl_compat.docs"):
        assert module in modules


@pytest.mark.parametrize("module", [m for m in entry_modules() if m not in LONG_JOB_WITHOUT_ARGUMENTS])
def test_without_arguments_a_command_fails_clearly_or_does_its_job(module, tmp_path):
    result = run_module([], module=module, cwd=tmp_path, env={"HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"})
    assert_no_traceback(result)
    if result.returncode == 0:  # its job needs no arguments: then it printed or wrote what it made
        assert result.stdout.strip() or os.listdir(tmp_path), f"{module} exited 0 and did nothing"
    else:
        assert result.returncode == 2 and "error" in (result.stderr + result.stdout).lower(), result.stderr[-2000:]


@pytest.mark.parametrize("module", entry_modules())
def test_help_says_what_the_command_does(module, tmp_path):
    result = run_module(["--help"], module=module, cwd=tmp_path, env={"HOME": str(tmp_path)})
    assert_no_traceback(result)
    assert result.returncode == 0, result.stderr[-2000:]
    text = result.stdout.lower()
    assert "usage" in text or "powered by hydra" in text, result.stdout[:2000]
    assert not os.listdir(tmp_path), f"{module} --help wrote {os.listdir(tmp_path)}"
