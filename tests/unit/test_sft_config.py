"""sft_trainer.yaml ↔ SFTConfig: documented keys, same defaults, did-you-mean for unknown keys, cross-key checks."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import yaml

from verlx.config.loader import CONFIG_DIR, ConfigError, build
from verlx.config.sft import SFTConfig
from verlx.trainer.main_sft import load_sft_config
from verlx.trainer.preflight_sft import validate_sft

YAML_PATH = os.path.join(CONFIG_DIR, "sft_trainer.yaml")


def _key_lines(path: str) -> list[tuple[int, str, str]]:
    """(line number, indentation, key) of every `key:` line."""
    with open(path) as f:
        lines = f.read().splitlines()
    found = []
    for number, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z_][A-Za-z0-9_]*):", line)
        if match:
            found.append((number, match.group(1), match.group(2)))
    return found


def test_every_yaml_key_has_a_comment_above_it():
    with open(YAML_PATH) as f:
        lines = f.read().splitlines()
    missing = [key for number, _, key in _key_lines(YAML_PATH) if not lines[number - 1].strip().startswith("#")]
    assert missing == []


def test_yaml_defaults_equal_the_dataclass_defaults():
    """The YAML (interpolations resolved) and SFTConfig() agree key for key, value for value."""
    cfg = load_sft_config([])
    assert cfg == SFTConfig(
        trainer=dataclasses.replace(
            SFTConfig().trainer,
            default_local_dir="checkpoints/verlx_sft/arithmetic",
            output_dir="outputs/verlx_sft/arithmetic",
        )
    )
    with open(YAML_PATH) as f:
        raw = yaml.safe_load(f)
    defaults = dataclasses.asdict(SFTConfig())
    assert raw.keys() == defaults.keys()
    for section, values in raw.items():
        assert values.keys() == defaults[section].keys(), section


def test_overrides_are_typed():
    cfg = load_sft_config(["optim.lr=1e-4", "data.train_batch_size=8", "trainer.total_training_steps=null",
                           "data.val_files=null", "trainer.logger=console", "trainer.target_val_accuracy=null"])
    assert (cfg.optim.lr, cfg.data.train_batch_size, cfg.trainer.total_training_steps) == (1e-4, 8, None)
    assert cfg.data.val_files is None and cfg.trainer.loggers == ["console"]


@pytest.mark.parametrize(
    "override, hint",
    [
        ("optim.warmup_steps_ratio=0.1", "Did you mean 'lr_warmup_steps_ratio'?"),
        ("data.respons_key=answer", "Did you mean 'response_key'?"),
        ("trainer.total_training_step=5", "Did you mean 'total_training_steps'?"),
        ("model.partial_pretrian=/x", "Did you mean 'partial_pretrain'?"),
    ],
)
def test_unknown_override_fails_with_did_you_mean(override, hint):
    with pytest.raises(ConfigError) as err:
        load_sft_config([override])
    assert hint in str(err.value)


def test_unknown_key_in_a_mapping_and_wrong_type():
    with pytest.raises(ConfigError) as err:
        build(SFTConfig, {"data": {"max_lenght": 10, "train_batch_size": "many"}})
    message = str(err.value)
    assert "unknown key 'data.max_lenght'. Did you mean 'max_length'?" in message
    assert "'data.train_batch_size' = 'many' must be int" in message


def test_cross_key_checks_report_every_problem():
    cfg = build(SFTConfig, {
        "data": {"train_batch_size": 6, "truncation": "middle"},
        "optim": {"lr_scheduler": "cosin"},
        "trainer": {"logger": ["console", "wandbb"], "device": "gpu", "n_gpus_per_node": 4},
    })
    with pytest.raises(ConfigError) as err:
        validate_sft(cfg, world_size=4)
    message = str(err.value)
    assert "model.partial_pretrain is not set" in message
    assert "data.train_batch_size=6 does not split evenly over 4 data-parallel shard(s) (4 processes" in message
    assert "data.truncation='middle' is not one of ['error', 'left', 'right']" in message
    assert "optim.lr_scheduler='cosin'" in message and "Did you mean 'cosine'?" in message
    assert "trainer.logger='wandbb' is not one of" in message and "Did you mean 'wandb'?" in message
    assert "trainer.device='gpu'" in message
    assert len(err.value.problems) == 6  # n_gpus_per_node=4 matches the 4 processes: no problem there
    with pytest.raises(ConfigError, match=r"trainer.target_val_accuracy=0.15 needs validation during training"):
        validate_sft(build(SFTConfig, {"model": {"partial_pretrain": "/m"}, "data": {"val_files": None},
                                       "trainer": {"target_val_accuracy": 0.15}}), 1)
    validate_sft(build(SFTConfig, {"model": {"partial_pretrain": "/m"}, "data": {"val_files": None}}), 1)
    with pytest.raises(ConfigError, match=r"trainer.nnodes × trainer.n_gpus_per_node = 4 but the launcher started 2"):
        validate_sft(build(SFTConfig, {"model": {"partial_pretrain": "/m"}, "trainer": {"n_gpus_per_node": 4}}), 2)
    validate_sft(build(SFTConfig, {"model": {"partial_pretrain": "/m"}}), world_size=2)
