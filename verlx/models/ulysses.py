"""Ulysses sequence parallelism (DeepSpeed-Ulysses): a packed sequence split over the ranks of an SP group.

Every layer but attention works on this rank's slice of the tokens. Around attention an all-to-all trades the
split: each rank gets every token for 1/sp of the heads, runs the ordinary varlen kernel with the full
sequence boundaries, and a second all-to-all gives the tokens back. Each collective's backward is the inverse
collective, so the parameter gradients of the SP ranks sum to the gradient of the unsplit model.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def check_ulysses(hf_config, sp_size: int, world_size: int, key: str = "ulysses_sequence_parallel_size") -> None:
    """Clear errors for SP sizes the head split cannot serve."""
    if sp_size < 1:
        raise ValueError(f"{key}={sp_size} must be at least 1")
    if world_size % sp_size:
        raise ValueError(f"{key}={sp_size} must divide the world size {world_size}")
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % sp_size:
        raise ValueError(f"{key}={sp_size} must divide the number of attention heads ({heads}); sizes that work: "
                         f"{[d for d in range(1, heads + 1) if heads % d == 0 and world_size % d == 0]}")
    if kv_heads % sp_size and sp_size % kv_heads:
        raise ValueError(f"{key}={sp_size} and the {kv_heads} key/value heads: one must divide the other (KV heads "
                         "are split over the SP ranks, or replicated when there are fewer of them than ranks)")


def kv_repeats(kv_heads: int, sp_size: int) -> int:
    """How many copies of each KV head make their count divisible by the SP size (1 when it already is)."""
    return 1 if kv_heads % sp_size == 0 else sp_size // kv_heads


class _AllToAll(torch.autograd.Function):
    """Chunk i of dim 0 goes to rank i; the backward sends every gradient chunk back the same way."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        x = x.contiguous()
        out = torch.empty_like(x)
        dist.all_to_all_single(out, x, group=group)
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        out = torch.empty_like(grad)
        dist.all_to_all_single(out, grad, group=ctx.group)
        return out, None


def seq_to_heads(x: torch.Tensor, group) -> torch.Tensor:
    """[T/sp, H, D] (this rank's tokens, all heads) → [T, H/sp, D] (all tokens, this rank's heads)."""
    sp = dist.get_world_size(group)
    tokens, heads, dim = x.shape
    chunks = x.reshape(tokens, sp, heads // sp, dim).transpose(0, 1)
    return _AllToAll.apply(chunks, group).reshape(sp * tokens, heads // sp, dim)


def heads_to_seq(x: torch.Tensor, group) -> torch.Tensor:
    """[T, H/sp, D] → [T/sp, H, D], the inverse of `seq_to_heads`."""
    sp = dist.get_world_size(group)
    tokens, heads, dim = x.shape
    received = _AllToAll.apply(x.reshape(sp, tokens // sp, heads, dim), group)
    return received.transpose(0, 1).reshape(tokens // sp, sp * heads, dim)


class _GatherSequence(torch.autograd.Function):
    """All ranks' dim-0 slices concatenated; backward keeps this rank's slice of the (replicated) gradient."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, group) -> torch.Tensor:
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        sp, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(sp)[rank].contiguous(), None


def gather_sequence(x: torch.Tensor, group) -> torch.Tensor:
    """[T/sp, ...] on every rank → [T, ...] on every rank.

    Every SP rank then computes the same loss from the gathered tensor; the backward keeps only this rank's
    slice, so summing parameter gradients over the SP group counts each token once.
    """
    return _GatherSequence.apply(x, group)


def sequence_parallel_group(sp_size: int):
    """(this rank's SP group or None, dp_rank, dp_size): SP groups are blocks of consecutive ranks.

    Collective: every rank calls it with the same size (torch.distributed.new_group for every block).
    """
    world, rank = dist.get_world_size(), dist.get_rank()
    if sp_size == 1:
        return None, rank, world
    mine = None
    for start in range(0, world, sp_size):
        group = dist.new_group(list(range(start, start + sp_size)))
        if start <= rank < start + sp_size:
            mine = group
    return mine, rank // sp_size, world // sp_size
