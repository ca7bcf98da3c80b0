"""critic/score/zero_variance_ratio and the warning for a reward that gives GRPO nothing to learn from."""

from __future__ import annotations

import logging

import numpy as np
import torch

from verlx.algorithms.groups import group_ids, uniform_groups
from verlx.config.run import CustomRewardFunctionConfig
from verlx.protocol import DataProto
from verlx.reward.loading import describe_reward_function
from verlx.trainer.reward_signal import RewardSignalMonitor

LOGGER = "verlx.trainer.reward_signal"


def scored(scores, uids, sources) -> DataProto:
    """A batch whose samples' rewards sit on their last response token (width 3)."""
    token_level = torch.zeros(len(scores), 3)
    token_level[:, 1] = torch.tensor(scores, dtype=torch.float32)
    return DataProto({"token_level_scores": token_level},
                     {"uid": np.array(uids, dtype=object), "data_source": np.array(sources, dtype=object)})


def monitor(patience: int = 3) -> RewardSignalMonitor:
    return RewardSignalMonitor(lambda source: f"<reward of {source}>", "data_source", patience)


def test_uniform_groups_of_a_batch():
    ids, num_groups = group_ids(["u1", "u1", "u2", "u2", "u3"])
    uniform, count = uniform_groups(torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5]), ids, num_groups)
    assert uniform.tolist() == [True, False, True] and count.tolist() == [2, 2, 1]


def test_ratio_is_the_share_of_groups_whose_samples_all_scored_the_same(caplog):
    # groups: u1 (1, 1) uniform, u2 (0, 1) mixed, u3 (0, 0) uniform, u4 (0.5, 0.25) mixed → 2 of 4
    batch = scored([1, 1, 0, 1, 0, 0, 0.5, 0.25], ["u1", "u1", "u2", "u2", "u3", "u3", "u4", "u4"], ["a"] * 8)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for step in range(1, 6):
            assert monitor().observe(batch, step) == {"critic/score/zero_variance_ratio": 0.5}
    assert not caplog.records  # a source with some signal is never warned about


def test_a_constant_reward_is_reported_after_patience_steps_naming_the_reward(caplog):
    m = monitor(patience=3)
    constant = scored([0.0] * 6, ["u1", "u1", "u2", "u2", "u3", "u3"], ["a"] * 6)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert m.observe(constant, 1)["critic/score/zero_variance_ratio"] == 1.0
        m.observe(constant, 2)
        assert not caplog.records
        m.observe(constant, 3)
        m.observe(constant, 4)  # reported once per streak
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert message.startswith("step 3: for 3 steps in a row every prompt group of data_source 'a' scored the same "
                              "on all its 2 samples (every sample scored 0;")
    assert "Reward: <reward of a>." in message and "algorithm.filter_groups.enable=true" in message


def test_only_the_source_without_signal_is_reported_and_a_streak_restarts(caplog):
    m = monitor(patience=2)
    uids = ["u1", "u1", "u2", "u2"]
    # source a: always uniform, but one group right and one wrong; source b: mixed at step 2 only
    steps = [scored([1, 1, 0, 0], uids, ["a", "a", "b", "b"]),
             scored([1, 1, 0, 1], uids, ["a", "a", "b", "b"]),
             scored([0, 0, 1, 1], uids, ["a", "a", "b", "b"])]
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        ratios = [m.observe(batch, step)["critic/score/zero_variance_ratio"] for step, batch in enumerate(steps, 1)]
    assert ratios == [1.0, 0.5, 1.0]
    assert [r.getMessage()[:60] for r in caplog.records] == [
        "step 2: for 2 steps in a row every prompt group of data_sour"]
    assert "data_source 'a'" in caplog.records[0].getMessage()


def test_one_sample_per_prompt_compares_the_whole_batch_of_a_source(caplog):
    m = monitor(patience=1)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert m.observe(scored([1, 0, 1], ["u1", "u2", "u3"], ["a"] * 3), 1) == {
            "critic/score/zero_variance_ratio": 0.0}
        assert m.observe(scored([1, 1, 1], ["u1", "u2", "u3"], ["a"] * 3), 2) == {
            "critic/score/zero_variance_ratio": 1.0}
    assert "every sample scored 1;" in caplog.records[0].getMessage()


def test_describe_reward_function(tmp_path):
    builtin = describe_reward_function(CustomRewardFunctionConfig(), "arithmetic")
    assert builtin == ("the built-in score for data_source 'arithmetic' "
                       "(verlx.reward.scores.gsm8k.score_gsm8k_strict)")
    assert "none is registered" in describe_reward_function(CustomRewardFunctionConfig(), "nowhere")
    custom = CustomRewardFunctionConfig(path=str(tmp_path / "r.py"), name="score_it")
    assert describe_reward_function(custom, "arithmetic") == f"custom_reward_function score_it in {tmp_path}/r.py"

