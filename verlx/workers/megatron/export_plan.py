"""Streaming megatron weights to a rollout engine in HF names, one parameter at a time.

The plan lists every parameter the engine needs: its HF names and shapes, the pipeline stage (and virtual chunk)
that owns it, and how its TP shards are concatenated. The iterator walks the plan on every rank in the same
order: the owning stage gathers the shards over its TP group, then the merged tensor is broadcast over the
pipeline group, so every rank sees the same (name, tensor) stream and at most one merged parameter is alive.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verlx.workers.megatron.architectures import ModelDims
from verlx.workers.megatron.parallel import ParallelLayout
from verlx.workers.megatron.weight_layout import (
    REPLICATED,
    ParamSpec,
    is_tied_copy,
    merged_shape,
    param_specs,
    placement,
    split_to_hf,
    tp_merge,
)


@dataclass(frozen=True)
class ExportEntry:
    spec: ParamSpec
    local_name: str  # the megatron name inside its chunk (local layer index, local layer spec)
    pp_rank: int
    chunk: int
    tp_split: str  # how TP shards are concatenated: replicated | column | row | vocab | glu
    merged_shape: tuple[int, ...]
    hf: tuple[tuple[str, tuple[int, ...]], ...]  # (HF name, HF shape) of every tensor this parameter yields


def _hf_shapes(spec: ParamSpec, dims: ModelDims, shape: tuple[int, ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    meta = torch.empty(shape, device="meta")
    return tuple((name, tuple(t.shape)) for name, t in split_to_hf(spec, meta, dims))


def export_plan(dims: ModelDims, layout: ParallelLayout) -> list[ExportEntry]:
    """The per-parameter plan, in model order; tied output layers are left out (the engine ties them)."""
    plan = []
    for spec in param_specs(dims, layout.pp):
        if is_tied_copy(spec, dims):
            continue
        where = placement(spec, dims, layout)
        shape = merged_shape(spec, dims, layout.tp)
        plan.append(ExportEntry(spec, spec.local_name(where.local_layer), where.pp_rank, where.chunk, spec.tp_split,
                                shape, _hf_shapes(spec, dims, shape)))
    return plan


def iter_hf_weights(
    plan: Sequence[ExportEntry],
    dims: ModelDims,
    local_params: Sequence[dict[str, torch.Tensor]],
    pp_rank: int,
    tp_group: dist.ProcessGroup | None,
    pp_group: dist.ProcessGroup | None,
    dtype: torch.dtype,
    device: torch.device,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every entry of `plan`, identical on every rank of the TP × PP groups.

    `local_params[chunk][local_name]` are this rank's shards (local-spec names). Collective: every rank of both
    groups must iterate to the end.
    """
    tp_size = dist.get_world_size(tp_group) if tp_group is not None else 1
    pp_size = dist.get_world_size(pp_group) if pp_group is not None else 1
    for entry in plan:
        if entry.pp_rank == pp_rank:
            shard = local_params[entry.chunk][entry.local_name].detach().to(device=device, dtype=dtype)
            if tp_size > 1 and entry.tp_split != REPLICATED:
                parts = [torch.empty_like(shard) for _ in range(tp_size)]
                dist.all_gather(parts, shard.contiguous(), group=tp_group)
                merged = tp_merge(entry.tp_split, parts)
                del parts
            else:
                merged = shard
        else:
            merged = torch.empty(entry.merged_shape, dtype=dtype, device=device)
        if pp_size > 1:
            merged = merged.contiguous()
            dist.broadcast(merged, src=dist.get_global_rank(pp_group, entry.pp_rank), group=pp_group)
        yield from split_to_hf(entry.spec, merged, dims)
        del merged
