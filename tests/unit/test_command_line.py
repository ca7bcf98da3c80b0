"""The command lines veRL and Hydra users type, run through the real entry point (`python -m ...`) in a subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers.commands import REPO_DIR, assert_no_traceback, printed_job_config, run_module


# ---------------------------------------------------------------------- Hydra's own flags
@pytest.mark.parametrize("flags", [["--cfg", "job"], ["-c", "job"], ["--cfg=job"], ["trainer.nnodes=3", "--cfg", "job"],
                                   ["--cfg", "job", "trainer.nnodes=3"], ["--cfg", "job", "--resolve"]])
def test_cfg_job_prints_the_composed_config(flags, tmp_path):
    out = printed_job_config(run_module(flags, cwd=tmp_path))
    assert re.search(r"^data:\n  tokenizer: null\n  train_files: ~/data/gsm8k/train.parquet$", out, re.M)
    nnodes = 3 if "trainer.nnodes=3" in flags else 1
    assert re.search(rf"^  nnodes: {nnodes}$", out, re.M)


@pytest.mark.parametrize("flags", [["--cfg", "job", "-p", "data"], ["-c", "job", "--package", "data"]])
def test_cfg_with_a_package_prints_that_section(flags, tmp_path):
    out = printed_job_config(run_module(flags, cwd=tmp_path))
    assert out.startswith("# @package data\n") and "train_batch_size: 1024" in out and "actor_rollout_ref" not in out


def test_config_name_flag_composes_the_megatron_config(tmp_path):
    out = printed_job_config(run_module(["-cn", "ppo_megatron_trainer", "-c", "job"], cwd=tmp_path))
    assert re.search(r"^    strategy: megatron$", out, re.M)


@pytest.mark.parametrize("flags,expected", [
    (["--info", "config"], "Config search path"),
    (["--info"], "Installed Hydra Plugins"),
    (["-i", "defaults"], "Defaults List"),
    (["--help"], "Powered by Hydra"),
    (["-h"], "Powered by Hydra"),
    (["--hydra-help"], "--cfg,-c : Show config instead of running [job|hydra|all]"),
    (["--version"], "Hydra 1."),
    (["--shell-completion", "install=bash"], "hydra_bash_completion"),
    (["-sc", "install=bash"], "hydra_bash_completion"),
])
def test_hydra_information_flags(flags, expected, tmp_path):
    result = run_module(flags, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout + result.stderr
    assert_no_traceback(result)


def test_multirun_flag_reaches_hydra_and_each_job_is_checked(tmp_path):
    result = run_module(["-m", "data.train_files=/nowhere/train.parquet", "trainer.nnodes=1,2"], cwd=tmp_path)
    assert result.returncode == 2
    assert "Launching 2 jobs locally" in result.stdout + result.stderr
    assert "data.train_files: file '/nowhere/train.parquet' does not exist" in result.stderr
    assert_no_traceback(result)


def test_flags_do_not_hide_unknown_keys(tmp_path):
    result = run_module(["--cfg", "job", "trainer.n_gpu_per_node=2"], cwd=tmp_path)
    assert result.returncode == 2
    assert "unknown key 'trainer.n_gpu_per_node'. Did you mean 'n_gpus_per_node'?" in result.stderr
    assert_no_traceback(result)


@pytest.mark.parametrize("module", ["verlx.trainer.main_generation", "verlx.trainer.main_eval"])
def test_cfg_job_in_the_other_hydra_commands(module, tmp_path):
    out = printed_job_config(run_module(["--cfg", "job", "data.path=/x.parquet"], module=module, cwd=tmp_path))
    assert "path: /x.parquet" in out


# ---------------------------------------------------------------------- the README's GSM8K command
def readme_gsm8k_command() -> str:
    """The `python -m verlx.trainer.main_ppo ...` command of README.md's "Training on GSM8K", as written."""
    with open(os.path.join(REPO_DIR, "README.md")) as f:
        readme = f.read()
    section = readme.split("## Training on GSM8K", 1)[1]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    joined = block.replace("\\\n", " ")
    (command,) = [line for line in joined.splitlines() if "verlx.trainer.main_ppo" in line]
    return command.strip()


def test_readme_gsm8k_command_composes_with_cfg_job(tmp_path):
    command = readme_gsm8k_command()
    assert command.startswith("python -m verlx.trainer.main_ppo ")
    line = f"{command} --cfg job".replace("python", sys.executable, 1)
    result = subprocess.run(["bash", "-c", line], capture_output=True, text=True, cwd=tmp_path, timeout=300,
                            env={**os.environ, "PYTHONPATH": REPO_DIR, "HOME": str(tmp_path)})
    out = printed_job_config(result)
    for expected in (f"  train_files: {tmp_path}/data/gsm8k/train.parquet", "  train_batch_size: 256",
                     "    path: Qwen/Qwen2.5-0.5B-Instruct", "  adv_estimator: grpo", "    name: native",
                     "  total_epochs: 15", "  - console\n  - file"):
        assert expected in out, expected


# ---------------------------------------------------------------------- command lines of older veRL releases
def compose(overrides):
    from verlx.config.loader import build, load_yaml, to_container
    from verlx.config.schema import PPOConfig

    return build(PPOConfig, to_container(load_yaml(overrides=overrides)))


def test_plus_on_a_key_that_exists_is_dropped_with_a_warning(caplog):
    cfg = compose(["+trainer.val_before_train=False", "+data.val_batch_size=4"])
    assert cfg.trainer.val_before_train is False and cfg.data.val_batch_size == 4
    assert ("'+trainer.val_before_train=False' is read as 'trainer.val_before_train=False': "
            "trainer.val_before_train exists now, so the '+' (add a new key) is dropped") in caplog.text


def test_plus_still_adds_keys_to_free_form_sections(caplog):
    cfg = compose(["+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs.vllm == {"swap_space": 4}
    assert "swap_space" not in caplog.text


def test_moved_keys_are_rewritten_with_a_warning(caplog):
    cfg = compose(["ray_init.num_cpus=3", "actor_rollout_ref.actor.optim.warmup_style=cosine",
                   "+critic.optim.warmup_style=cosine"])
    assert cfg.ray_kwargs.ray_init.num_cpus == 3
    assert cfg.actor_rollout_ref.actor.optim.lr_scheduler_type == "cosine"
    assert cfg.critic.optim.lr_scheduler_type == "cosine"
    assert ("'ray_init.num_cpus=3' is read as 'ray_kwargs.ray_init.num_cpus=3': ray_init became "
            "ray_kwargs.ray_init") in caplog.text
    assert ("'+critic.optim.warmup_style=cosine' is read as 'critic.optim.lr_scheduler_type=cosine': "
            "critic.optim.warmup_style became critic.optim.lr_scheduler_type") in caplog.text


def test_deprecated_global_micro_batch_sizes_are_read_with_a_warning(caplog):
    cfg = compose(["actor_rollout_ref.actor.ppo_micro_batch_size=8", "critic.ppo_micro_batch_size=null"])
    assert cfg.actor_rollout_ref.actor.ppo_micro_batch_size == 8
    assert ("'actor_rollout_ref.actor.ppo_micro_batch_size=8': actor_rollout_ref.actor.ppo_micro_batch_size is "
            "veRL's deprecated global micro-batch size; it is read as "
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = this value / the data-parallel size") in caplog.text
    assert "critic.ppo_micro_batch_size=null" not in caplog.text


def test_an_older_verl_command_line_runs_through_the_entry_point(tmp_path):
    result = run_module(["data.train_batch_size=16", "+trainer.val_before_train=False", "ray_init.num_cpus=4",
                         "trainer.default_hdfs_dir=null", "--cfg", "job"], cwd=tmp_path)
    out = printed_job_config(result)
    assert re.search(r"^  val_before_train: false$", out, re.M)
    assert re.search(r"^ray_kwargs:\n  ray_init:\n    num_cpus: 4$", out, re.M)
    assert "WARNING" in result.stderr
    assert "'ray_init.num_cpus=4' is read as 'ray_kwargs.ray_init.num_cpus=4'" in result.stderr


# ---------------------------------------------------------------------- veRL's own launch-script shapes
def test_verls_config_path_flag_names_verlx_configs(tmp_path):
    """`--config-path=config --config-name=ppo_megatron_trainer`, as veRL's scripts write it for veRL's configs."""
    out = printed_job_config(run_module(["--config-path=config", "--config-name=ppo_megatron_trainer",
                                         "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2", "--cfg", "job"],
                                        cwd=tmp_path))
    assert re.search(r"^    strategy: megatron$", out, re.M)
    assert re.search(r"^  ref:\n(    .*\n)*    megatron:\n      tensor_model_parallel_size: 2$", out, re.M)


def test_a_scripts_own_yaml_composes_on_verlx_and_its_verl_keys_are_translated(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "my_trainer.yaml").write_text(
        "hydra:\n  searchpath:\n    - file://verl/trainer/config\n\ndefaults:\n  - ppo_trainer\n  - _self_\n\n"
        "data:\n  max_prompt_length: 77\nactor_rollout_ref:\n  actor:\n    fsdp_config:\n"
        "      ulysses_sequence_parallel_size: 2\n")
    result = run_module(["--config-path=config", "--config-name=my_trainer", "model_engine=dp",
                         "+actor_rollout_ref.rollout.engine_kwargs.sglang.attention_backend=fa3",
                         "trainer.use_legacy_worker_impl=disable", "--cfg", "job"], cwd=tmp_path)
    out = printed_job_config(result)
    assert re.search(r"^  max_prompt_length: 77$", out, re.M)
    assert re.search(r"^    ulysses_sequence_parallel_size: 2$", out, re.M) and "fsdp_config:\n      ulysses" not in out
    assert "attention_backend: fa3" in out
    assert "is read as actor_rollout_ref.actor.ulysses_sequence_parallel_size" in result.stderr
    assert "'trainer.use_legacy_worker_impl=disable' is ignored: verlx has one worker implementation" in result.stderr


def test_a_refused_key_in_a_scripts_yaml_fails_naming_file_and_line(tmp_path):
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "dapo.yaml").write_text("defaults:\n  - ppo_trainer\n  - _self_\n\n"
                                                   "data:\n  min_response_length: 64\n")
    result = run_module(["--config-path=config", "--config-name=dapo", "--cfg", "job"], cwd=tmp_path)
    assert result.returncode == 2
    assert (f"data.min_response_length=64 (set at {tmp_path}/config/dapo.yaml:6): verlx does not support a minimum "
            "response length") in result.stderr
    assert "Could not override" not in result.stderr
    assert_no_traceback(result)
