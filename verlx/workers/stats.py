"""Counts the workers share across ranks (tokens and sequences of a mini-batch) and the optimizer's memory."""

from __future__ import annotations

import torch
import torch.distributed as dist


def global_counts(response_mask: torch.Tensor, device: torch.device,
                  dp_size: int | None = None) -> dict[str, torch.Tensor]:
    """Token and sequence counts of a mini-batch, for loss aggregation that is exact across micro-batches.

    num_tokens / num_seqs are the totals over all data-parallel ranks divided by the number of ranks: the sharding
    backend averages gradients over ranks, so each rank normalises by its average share. dp_size (default: the
    world size) is the number of data-parallel shards those gradients are averaged over; loss_agg_mode token-sum
    scales by it.
    """
    local = torch.stack([response_mask.sum(), (response_mask.sum(-1) > 0).sum()]).double().to(device)
    total = local.clone()
    world = 1
    if dist.is_initialized():
        dist.all_reduce(total)
        world = dist.get_world_size()
    return {
        "num_tokens": (total[0] / world).clamp(min=1).float(),
        "num_seqs": (total[1] / world).clamp(min=1).float(),
        "rank_tokens": local[0].clamp(min=1).float(),
        "dp_size": torch.tensor(float(dp_size or world), device=device),
    }


def optimizer_state_bytes(optimizer) -> int:
    """Bytes of optimizer state this rank holds (its shard of sharded states)."""
    total = 0
    for _, state in optimizer.state.items():  # megatron's chained optimizers offer items() only
        for value in state.values():
            if isinstance(value, torch.Tensor):
                local = value.to_local() if hasattr(value, "to_local") else value
                total += local.numel() * local.element_size()
    return total
