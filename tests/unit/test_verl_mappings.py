"""veRL keys served by verlx features under other names: DAPO's reward_kwargs (hand-checked against veRL's
penalty, min(-(length - (max_resp_len - len)) / len × penalty_factor, 0)), reward_model.num_workers,
layered_summon and the reward model's raw chat; each said once at start, bad values refused before Ray."""

from __future__ import annotations

import pytest
from test_reward_managers import make_batch

from helpers.tiny_tokenizer import build_tiny_tokenizer
from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.reward.managers import DAPORewardManager, build_reward_manager
from verlx.trainer.preflight import validate
from verlx.trainer.verl_mappings import apply_verl_mappings

# veRL's DAPO recipe / examples, verbatim but for the values (recipe/dapo/run_dapo_qwen2.5_32b.sh style)
DAPO_KEYS = ["reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True",
             "+reward_model.reward_kwargs.overlong_buffer_cfg.len=4",
             "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=0.5",
             "+reward_model.reward_kwargs.overlong_buffer_cfg.log=True", "+reward_model.reward_kwargs.max_resp_len=10"]


def config_from(*overrides) -> PPOConfig:
    return build(PPOConfig, to_container(load_yaml(overrides=list(overrides))))


def test_dapo_reward_kwargs_drive_the_overlong_penalty(tmp_path):
    (tmp_path / "r.py").write_text("def compute_score(data_source, solution_str, ground_truth, extra_info):\n"
                                   "    return 1.0\n")
    # data.max_response_length (12) is not max_resp_len (10): veRL's window ends at max_resp_len
    config = config_from(*DAPO_KEYS, "data.max_response_length=12", "reward.num_workers=0",
                         f"custom_reward_function.path={tmp_path / 'r.py'}")
    assert config.reward_model.overlong_buffer.enable is False  # the recipe's spelling stays off
    notes = apply_verl_mappings(config)
    assert any("reward_model.reward_kwargs.overlong_buffer_cfg (veRL 0.9.1's DAPO keys)" in n and
               "penalty = min(-(length - (10 - 4)) / 4 × 0.5, 0)" in n for n in notes)
    # response lengths (eos included) 5, 6, 8, 10: expected length 10 - 4 = 6
    batch = make_batch(build_tiny_tokenizer(), ["a" * 4, "a" * 5, "a" * 7, "a" * 9], [""] * 4)
    with build_reward_manager(config, build_tiny_tokenizer()) as manager:
        assert isinstance(manager, DAPORewardManager)
        result = manager(batch)
    # -(L - 6) / 4 × 0.5 capped at 0: L=5 → 0, 6 → 0, 8 → -0.25, 10 → -0.5
    assert result.extra["overlong_reward"].tolist() == [0.0, 0.0, -0.25, -0.5]
    assert result.extra["overlong"].tolist() == [False, False, True, True]
    assert result.token_level_scores.sum(-1).tolist() == [1.0, 1.0, 0.75, 0.5]


@pytest.mark.parametrize("extra,message", [
    (["~reward_model.reward_kwargs.max_resp_len"], "reward_model.reward_kwargs.max_resp_len must be set"),
    (["reward_model.reward_manager=naive"], "overlong_buffer_cfg.enable=true needs reward_model.reward_manager=dapo"),
    (["reward_model.overlong_buffer.enable=true", "reward_model.overlong_buffer.len=2"],
     "are both enabled: they are one feature"),
    (["reward_model.reward_kwargs.overlong_buffer_cfg.len=0"], "overlong_buffer_cfg.len=0 must be > 0"),
    (["reward_model.reward_kwargs.max_resp_len=3"], "max_resp_len=3 must be at least"),
], ids=["no-max-resp-len", "naive-manager", "both-spellings", "zero-window", "window-too-long"])
def test_dapo_reward_kwargs_are_checked_before_ray(extra, message):
    keys = [k for k in DAPO_KEYS if not (extra[0].startswith("~") and k.endswith("max_resp_len=10"))]
    overrides = [*keys, *[e for e in extra if not e.startswith("~")]]
    with pytest.raises(ConfigError, match=message):
        validate(config_from(*overrides), check_files=False)


def test_num_workers_layered_summon_and_raw_chat_are_mapped():
    config = config_from("reward_model.num_workers=5", "actor_rollout_ref.rollout.layered_summon=True",
                         "reward_model.enable=true", "reward_model.model.path=/some/rm")
    assert config.reward.num_workers == 2 and config.data.return_raw_chat is False
    notes = apply_verl_mappings(config)
    assert config.reward.num_workers == 5
    assert config.data.return_raw_chat is True  # the reward model re-renders each chat (input_tokenizer is set)
    assert len(notes) == 3
    assert notes[0].startswith("reward_model.num_workers=5 (veRL: processes computing rewards) is verlx's "
                               "reward.num_workers")
    assert "needs the prompt's messages, so data.return_raw_chat=true" in notes[1]
    assert "layered_summon=true: verlx's weight push" in notes[2] and "one tensor at a time" in notes[2]
    assert apply_verl_mappings(config_from()) == []  # nothing set, nothing said
    with pytest.raises(ConfigError, match="reward_model.num_workers=-1 must be >= 0"):
        validate(config_from("reward_model.num_workers=-1"), check_files=False)


def test_reward_model_settings_are_checked_before_ray(tmp_path):
    with pytest.raises(ConfigError) as e:
        validate(config_from("reward_model.enable=true", "reward_model.ulysses_sequence_parallel_size=2",
                             "reward_model.forward_max_token_len_per_gpu=100", "reward_model.strategy=megatron",
                             "reward_model.micro_batch_size=4", "trainer.n_gpus_per_node=8"), check_files=False)
    text = str(e.value)
    assert "reward_model.enable=true needs reward_model.model.path" in text
    assert "reward_model.strategy='megatron' is not one of ['fsdp', 'fsdp2']" in text
    assert "reward_model.ulysses_sequence_parallel_size=2" in text
    assert "micro_batch_size / 8 GPUs) = 0 must be positive" in text
    assert "forward_max_token_len_per_gpu=100 is smaller than the longest reward-model input (1024 tokens" in text
    with pytest.raises(ConfigError, match=r"reward_model.model.path: directory '\S+/nope' does not exist"):
        validate(config_from("reward_model.enable=true", f"reward_model.model.path={tmp_path}/nope"))
    warnings = validate(config_from("reward_model.enable=true", "reward_model.model.path=/rm",
                                    "reward_model.reward_manager=dapo", "reward_model.overlong_buffer.enable=true",
                                    "reward_model.overlong_buffer.len=8", "trainer.n_gpus_per_node=8"),
                        check_files=False)
    assert any("so DAPO's overlong penalty is not applied" in w for w in warnings)
