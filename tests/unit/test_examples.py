"""The example run scripts stay valid: each is run with a stand-in `python3` that records the exact arguments bash
passes, and the recorded overrides go through the real config loading and validation (no files needed)."""

from __future__ import annotations

import glob
import os
import stat
import subprocess

import pytest

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer.preflight import validate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = sorted(glob.glob(os.path.join(REPO, "examples", "ppo_trainer", "*.sh")))


def recorded_arguments(script: str, tmp_path) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "args"
    stub = bin_dir / "python3"
    stub.write_text(f'#!/bin/sh\nfor a in "$@"; do printf "%s\\0" "$a"; done > {record}\n')
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": "/home/user"}
    subprocess.run(["bash", script], check=True, env=env, capture_output=True)
    return record.read_text().split("\0")[:-1]


@pytest.mark.parametrize("script", SCRIPTS, ids=[os.path.basename(s) for s in SCRIPTS])
def test_example_script_passes_config_validation(script, tmp_path):
    args = recorded_arguments(script, tmp_path)
    assert args[:2] == ["-m", "verlx.trainer.main_ppo"]
    args = args[2:]
    config_name = "ppo_trainer"
    if args[:1] == ["--config-name"]:
        config_name, args = args[1], args[2:]
    cfg = build(PPOConfig, to_container(load_yaml(config_name, args)))
    if cfg.actor_rollout_ref.actor.strategy == "megatron":
        from verlx.workers.megatron.config_checks import megatron_core_available

        if not megatron_core_available():
            with pytest.raises(ConfigError) as info:
                validate(cfg, check_files=False)
            assert info.value.problems == ["strategy=megatron needs megatron-core, which is not installed; "
                                           "install it with: pip install 'verlx[megatron]'"]
            return
    validate(cfg, check_files=False)


def test_there_is_a_script_for_each_engine_and_setup():
    names = {os.path.basename(s) for s in SCRIPTS}
    for expected in ("grpo", "ppo", "8gpu", "lora", "native", "sglang", "vllm", "megatron"):
        assert any(expected in n for n in names), expected


TUNING_KEYS = ("micro_batch_size", "max_token_len", "use_dynamic_bsz", "enable_gradient_checkpointing")


@pytest.mark.parametrize("name", ["run_qwen2.5-0.5b_grpo.sh", "run_qwen2.5-0.5b_ppo.sh", "run_qwen2-7b_grpo_8gpu.sh",
                                  "run_qwen2.5-0.5b_gsm8k_tool.sh"])
def test_examples_leave_batching_and_checkpointing_to_the_workers(name, tmp_path):
    """The FSDP examples set no micro-batch size, token budget or checkpointing flag: the workers decide them."""
    args = recorded_arguments(os.path.join(REPO, "examples", "ppo_trainer", name), tmp_path)
    assert not [a for a in args if any(key in a.split("=")[0] for key in TUNING_KEYS)]
    cfg = build(PPOConfig, to_container(load_yaml("ppo_trainer", args[2:])))
    arr = cfg.actor_rollout_ref
    assert arr.actor.use_dynamic_bsz is None and arr.actor.ppo_max_token_len_per_gpu is None
    assert arr.model.enable_gradient_checkpointing is None


def test_readme_gsm8k_command_sets_no_tuning_flags():
    with open(os.path.join(REPO, "README.md")) as f:
        readme = f.read()
    command = readme.split("## Training on GSM8K", 1)[1].split("```", 2)[1]
    assert "verlx.trainer.main_ppo" in command
    assert not [key for key in TUNING_KEYS if key in command]
