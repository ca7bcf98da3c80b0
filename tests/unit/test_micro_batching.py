"""Token-budget micro-batches read `*_max_token_len_per_gpu` as veRL does: the tokens one GPU holds, so a micro-batch
split over a Ulysses group of size sp holds up to budget × sp tokens (veRL 0.9.1 verl/workers/engine/utils.py
prepare_micro_batches; the 2026-01 dp_actor / dp_critic)."""

from __future__ import annotations

import pytest
import torch

from verlx.config.roles import ActorConfig, CriticConfig
from verlx.protocol import DataProto
from verlx.utils.batch_sizes import sequence_split_size
from verlx.workers.micro_batching import micro_batches, ppo_mini_batches

LENGTHS = [10, 9, 8, 7, 6, 5]  # 45 tokens


def batch(lengths=LENGTHS) -> DataProto:
    """Rows of the given real lengths (input id = row index + 1, so every micro-batch says which rows it holds)."""
    rows, width = len(lengths), max(lengths)
    mask = (torch.arange(width) < torch.tensor(lengths)[:, None]).long()
    ids = (torch.arange(rows)[:, None] + 1).expand(rows, width) * mask
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                      "responses": ids[:, -3:], "response_mask": mask[:, -3:]})


def rows_of(parts: list[DataProto]) -> list[list[int]]:
    return [(p.batch["input_ids"][:, 0] - 1).tolist() for p in parts]


def test_a_budget_of_12_splits_differently_per_gpu_and_per_micro_batch():
    # one GPU: micro-batches of at most 12 tokens. ceil(45/12) = 4 groups do not fit (longest-first greedy gives
    # 10 | 9 | 8+5 | 7+6), 5 do: 10 | 9 | 8 | 7 | 6+5
    parts, order = micro_batches(batch(), None, True, 12)
    assert rows_of(parts) == [[0], [1], [2], [3], [4, 5]] and order.tolist() == [0, 1, 2, 3, 4, 5]
    # a Ulysses pair: 12 tokens on each GPU, 24 per micro-batch. ceil(45/24) = 2: 10+7+6 = 23 | 9+8+5 = 22
    parts, order = micro_batches(batch(), None, True, 12, split=2)
    assert rows_of(parts) == [[0, 3, 4], [1, 2, 5]] and order.tolist() == [0, 3, 4, 1, 2, 5]


def test_a_per_gpu_budget_below_the_longest_sequence_is_enough_for_the_group():
    with pytest.raises(ValueError) as info:
        micro_batches(batch(), None, True, 6, key="actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
    assert str(info.value) == (
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=6 is smaller than the longest sequence (10 tokens: prompt "
        "+ response); a micro-batch must hold at least one sequence, so raise it to at least 10")
    parts, _ = micro_batches(batch(), None, True, 6, split=2)  # 12 tokens per micro-batch, 6 on each GPU
    assert rows_of(parts) == [[0], [1], [2], [3], [4, 5]]
    with pytest.raises(ValueError) as info:
        micro_batches(batch(), None, True, 4, key="critic.forward_max_token_len_per_gpu", split=2)
    assert str(info.value) == (
        "critic.forward_max_token_len_per_gpu=4 lets a micro-batch hold 4 × 2 = 8 tokens (veRL's per-GPU budget: "
        "each of the 2 GPUs of the sequence-parallel group holds up to 4 of them), fewer than the longest sequence "
        "(10 tokens: prompt + response); a micro-batch must hold at least one sequence, so raise it to at least 5")


def test_fixed_size_micro_batches_do_not_depend_on_the_split():
    parts, order = micro_batches(batch(), 4, False, 12, split=2)
    assert rows_of(parts) == [[0, 1, 2, 3], [4, 5]] and order is None


def test_the_update_iterator_multiplies_by_the_roles_sequence_parallel_size():
    def update_parts(role) -> list[list[int]]:
        minis = list(ppo_mini_batches(batch(), role, 6, None, torch.device("cpu"), key="role"))
        assert len(minis) == 1
        return rows_of(minis[0].micro_batches)

    actor = ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=12, ulysses_sequence_parallel_size=2)
    critic = CriticConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=12, ulysses_sequence_parallel_size=2)
    assert update_parts(actor) == update_parts(critic) == [[0, 3, 4], [1, 2, 5]]
    assert update_parts(ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=12)) == [[0], [1], [2], [3],
                                                                                              [4, 5]]
    with pytest.raises(ValueError, match=r"^role.ppo_max_token_len_per_gpu=4 lets a micro-batch hold 4 × 2 = 8 "):
        update_parts(ActorConfig(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=4, ulysses_sequence_parallel_size=2))


def test_the_split_is_ulysses_for_fsdp_and_context_parallelism_for_megatron():
    """veRL's megatron workers multiply the budgets by megatron.context_parallel_size and assert Ulysses = 1."""
    assert sequence_split_size(ActorConfig(ulysses_sequence_parallel_size=4)) == 4
    assert sequence_split_size(CriticConfig(strategy="fsdp2", ulysses_sequence_parallel_size=2)) == 2
    megatron = ActorConfig(strategy="megatron", ulysses_sequence_parallel_size=4)
    assert sequence_split_size(megatron) == 1
    megatron.megatron.context_parallel_size = 2
    assert sequence_split_size(megatron) == 2
