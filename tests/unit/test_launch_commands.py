"""veRL-style launch command lines run unchanged (issue 23), on a corpus written for these tests
(tests/data/launch_commands.yaml, with its own config directory tests/data/launch_configs): each one, `verl.` read as
`verlx.`, composes, types and passes preflight, or is refused with an input error (exit 2, no traceback) whose
message names what verlx lacks or what to change. In one process, without Ray, downloads or GPUs.

veRL's own example scripts are measured by benchmarks/verl_scripts.py against a veRL checkout (docs/verl_compat.md).
"""

from __future__ import annotations

import importlib.util
import os
import shlex

import pytest
import yaml

from helpers.commands import assert_no_traceback, run_module
from helpers.launch_commands import ENTRY_POINTS, Fixtures, command_from_line, make_fixtures, run_command

DATA_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data")
with open(os.path.join(DATA_DIR, "launch_commands.yaml")) as _f:
    CORPUS = {entry["name"]: entry for entry in yaml.safe_load(_f)}


def module_and_argv(line: str) -> tuple[str, list[str]]:
    """The module after `-m` (python3 -m ..., torchrun ... -m ...) and the arguments after it."""
    words = shlex.split(line)
    i = words.index("-m")
    return words[i + 1], words[i + 2:]


def run_entry(name: str, fixtures: Fixtures):
    module, argv = module_and_argv(CORPUS[name]["line"])
    return run_command(command_from_line(name, module, argv, DATA_DIR), fixtures)


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return make_fixtures(str(tmp_path_factory.mktemp("launch_commands")))


@pytest.mark.parametrize("name", [n for n, e in CORPUS.items() if e["expect"] == "pass"])
def test_command_composes_and_passes_preflight(fixtures, name):
    outcome = run_entry(name, fixtures)
    assert outcome.status == "pass", outcome.detail


@pytest.mark.parametrize("name", [n for n, e in CORPUS.items() if e["expect"] == "refused"])
def test_command_is_refused_naming_what_is_missing(fixtures, name):
    needed = CORPUS[name].get("unless_installed")
    if needed and importlib.util.find_spec(needed) is not None:
        pytest.skip(f"{needed} is installed here")
    outcome = run_entry(name, fixtures)
    assert outcome.status == "refused", f"{outcome.status}: {outcome.detail}"  # an input error: exit 2
    assert CORPUS[name]["says"] in outcome.detail
    assert "Traceback" not in outcome.detail


def test_the_corpus_covers_every_entry_point_and_both_outcomes():
    modules = {module_and_argv(e["line"])[0] for e in CORPUS.values()}
    assert modules >= set(ENTRY_POINTS) - {"verl.trainer.main_generation_server"}
    assert sum(e["expect"] == "pass" for e in CORPUS.values()) >= 15
    assert sum(e["expect"] == "refused" for e in CORPUS.values()) >= 10


def test_a_refused_command_exits_2_with_the_message_and_no_traceback(tmp_path):
    """As a user runs it: the real entry point, `verl` replaced by `verlx` (--cfg job: nothing starts)."""
    module, argv = module_and_argv(CORPUS["ascend_npu"]["line"])
    argv = [a.replace("{HOME}", str(tmp_path)) for a in argv]
    result = run_module([*argv, "--cfg", "job"], module=module.replace("verl.", "verlx.", 1), cwd=DATA_DIR,
                        timeout=120)
    assert result.returncode == 2, result.stderr
    assert_no_traceback(result)
    assert "trainer.device='npu' (set at command line: 'trainer.device=npu'): verlx does not support Ascend NPUs" \
           in result.stderr


def test_a_named_architecture_gets_its_stand_in_and_megatron_refuses_one_it_lacks(fixtures):
    """veRL's scripts name their checkpoints: the harness stands in each architecture's config (its layers and
    experts), so a megatron script for Moonlight (DeepSeek-V3's architecture) is judged as the real checkpoint
    would be, not as the Qwen2 stand-in."""
    import json

    def config(path):
        with open(os.path.join(fixtures.model_for(path), "config.json")) as f:
            return json.load(f)

    moonlight = config("$HOME/models/Moonlight-16B-A3B-Instruct")
    assert (moonlight["architectures"], moonlight["num_hidden_layers"], moonlight["n_routed_experts"]) == (
        ["DeepseekV3ForCausalLM"], 27, 64)
    assert config("Qwen/Qwen3-30B-A3B-Base")["num_experts"] == 128
    assert fixtures.model_for("Qwen/Qwen2.5-7B-Instruct") == fixtures.model_dir
    line = ("python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer algorithm.adv_estimator=grpo "
            "data.train_files=x data.val_files=x actor_rollout_ref.model.path=moonshotai/Moonlight-16B-A3B "
            "actor_rollout_ref.rollout.name=vllm trainer.n_gpus_per_node=8")
    module, argv = module_and_argv(line)
    outcome = run_command(command_from_line("moonlight", module, argv, DATA_DIR), fixtures)
    assert outcome.status == "refused", outcome.detail
    assert "is a DeepseekV3ForCausalLM: verlx's megatron engine does not support that architecture yet" in \
        outcome.detail
