"""DAPO dynamic sampling: which groups are kept."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from verlx.algorithms.dynamic_sampling import keep_informative_groups
from verlx.protocol import DataProto


def batch():
    # groups: a = rows 0, 1 (scores 1, 1); b = rows 2, 3 (0, 1); c = row 4 (alone); d = rows 5, 6 (0.3, 0.3)
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 0.3, 0.3])
    kl = torch.tensor([0.0, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0])  # the KL penalty makes group a differ after it
    return DataProto(
        {"token_level_scores": torch.stack([torch.zeros(7), scores], 1),
         "token_level_rewards": torch.stack([-kl, scores], 1)},
        {"uid": np.array(["a", "a", "b", "b", "c", "d", "d"], dtype=object),
         "acc": np.array([True, False, True, True, True, False, False], dtype=object)},
    )


def test_groups_whose_scores_all_agree_are_dropped():
    # a (1, 1) and d (0.3, 0.3) agree -> dropped; b differs; c is alone and kept (as in veRL)
    for metric in ("seq_reward", "score"):
        assert keep_informative_groups(batch(), metric).tolist() == [2, 3, 4]


def test_seq_final_reward_compares_rewards_after_the_kl_penalty():
    # a: 1 - 0 = 1 vs 1 - 0.1 = 0.9 now differ -> kept
    assert keep_informative_groups(batch(), "seq_final_reward").tolist() == [0, 1, 2, 3, 4]


def test_a_non_tensor_column_such_as_acc():
    # acc: a (True, False) differs; b (True, True) and d agree; c alone
    assert keep_informative_groups(batch(), "acc").tolist() == [0, 1, 4]


def test_a_score_column_from_the_reward_function_takes_precedence():
    data = batch()
    data.non_tensor_batch["score"] = np.array([0, 1, 0, 0, 5, 0, 0], dtype=object)
    assert keep_informative_groups(data, "score").tolist() == [0, 1, 4]


def test_unknown_metric_names_what_exists():
    with pytest.raises(ValueError, match=r"metric='accuracy' is neither built in .*columns present: \['acc', 'uid'\]"):
        keep_informative_groups(batch(), "accuracy")


def test_missing_uid():
    data = batch()
    data.non_tensor_batch.pop("uid")
    with pytest.raises(KeyError, match="uid"):
        keep_informative_groups(data, "score")
