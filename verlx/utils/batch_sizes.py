"""The PPO batch-size arithmetic, in one place for the workers (every training engine) and the config checks.

veRL's semantics: `ppo_mini_batch_size` counts prompts (each becomes `rollout.n` samples) over all data-parallel
ranks; micro-batch sizes count samples per GPU. The deprecated global `*_micro_batch_size` keys are split over the
data-parallel ranks.
"""

from __future__ import annotations

from dataclasses import dataclass


def per_gpu_micro_batch_size(per_gpu: int | None, global_size: int | None, dp: int) -> int | None:
    """`per_gpu` when set, else the global size split over `dp` ranks (0 when it is smaller than dp, which the
    config checks report); None when neither is set (a token budget, or an error the checks report)."""
    if per_gpu is not None:
        return per_gpu
    if global_size is not None:
        return max(global_size // dp, 0)
    return None


@dataclass(frozen=True)
class RankBatchSizes:
    """Samples per mini-batch (one optimizer step) and per micro-batch on one data-parallel rank."""

    mini: int
    micro: int | None


def ppo_batch_sizes(role, n: int, dp: int) -> RankBatchSizes:
    """`role` (actor or critic config): ppo_mini_batch_size × n / dp samples per mini-batch on each of the `dp`
    ranks, and its per-GPU micro-batch size."""
    return RankBatchSizes(
        mini=role.ppo_mini_batch_size * n // dp,
        micro=per_gpu_micro_batch_size(role.ppo_micro_batch_size_per_gpu, role.ppo_micro_batch_size, dp),
    )


def dynamic_batches(use_dynamic_bsz: bool | None, micro_batch_size: int | None) -> bool:
    """Whether a phase builds token-budget micro-batches: `use_dynamic_bsz` when set; unset (null), token budgets
    unless a micro-batch size is given (a veRL command line that sets one keeps its fixed micro-batches)."""
    return micro_batch_size is None if use_dynamic_bsz is None else use_dynamic_bsz


def sequence_split_size(role) -> int:
    """The GPUs that split each micro-batch's sequences for `role` (an actor, reference or critic config): its
    Ulysses size (fsdp), its context-parallel size (megatron). veRL's `*_max_token_len_per_gpu` budgets count the
    tokens one of them holds, so a token-budget micro-batch holds up to budget × this many tokens."""
    if role.strategy == "megatron":
        return role.megatron.context_parallel_size
    return role.ulysses_sequence_parallel_size


def micro_batch_token_limit(budget_per_gpu: int, split: int) -> int:
    """Tokens one token-budget micro-batch may hold: veRL's per-GPU budget × the GPUs that split it."""
    return budget_per_gpu * split


def budget_too_small(key: str, budget: int, split: int, longest: int, what: str) -> str:
    """The error for a per-GPU token budget `key`=`budget` whose micro-batches (budget × `split` tokens) cannot hold
    `what`, a sequence of `longest` tokens."""
    least = -(-longest // split)
    if split == 1:
        return (f"{key}={budget} is smaller than {what}; a micro-batch must hold at least one sequence, so raise it "
                f"to at least {least}")
    return (f"{key}={budget} lets a micro-batch hold {budget} × {split} = {micro_batch_token_limit(budget, split)} "
            f"tokens (veRL's per-GPU budget: each of the {split} GPUs of the sequence-parallel group holds up to "
            f"{budget} of them), fewer than {what}; a micro-batch must hold at least one sequence, so raise it to at "
            f"least {least}")
