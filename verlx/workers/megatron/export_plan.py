"""Streaming megatron weights to a rollout engine in HF names, one parameter at a time.

The plan lists every parameter the engine needs: its HF names and shapes, the pipeline stage (and virtual chunk,
and for an expert's weight the expert-parallel rank) that owns it, and how its TP shards are concatenated. The
iterator walks the plan on every rank in the same order: the owning ranks gather the shards over their TP group
(expert-TP for experts), an expert's weight is then broadcast over the expert-parallel group, and every merged
tensor over the pipeline group, so every rank sees the same (name, tensor) stream and at most one merged parameter
is alive. Experts go out in HF's checkpoint names (one tensor per expert and projection), which SGLang and vLLM
load.
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
    local_name: str  # the megatron name inside its chunk (local layer and expert index, local layer spec)
    pp_rank: int
    chunk: int
    tp_split: str  # how TP shards are concatenated: replicated | column | row | vocab | glu
    merged_shape: tuple[int, ...]
    hf: tuple[tuple[str, tuple[int, ...]], ...]  # (HF name, HF shape) of every tensor this parameter yields
    ep_rank: int = 0  # an expert's weight: the expert-parallel rank holding it (split over expert-TP ranks)


@dataclass(frozen=True)
class ExportGroups:
    """This rank's pipeline stage and expert-parallel rank, and the groups the export gathers and broadcasts over
    (None: a group of one)."""

    pp_rank: int
    tp_group: dist.ProcessGroup | None
    pp_group: dist.ProcessGroup | None
    ep_rank: int = 0
    etp_group: dist.ProcessGroup | None = None
    ep_group: dist.ProcessGroup | None = None


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
        plan.append(ExportEntry(spec, spec.local_name(where.local_layer, where.local_expert), where.pp_rank,
                                where.chunk, spec.tp_split, shape, _hf_shapes(spec, dims, shape), where.ep_rank))
    return plan


def _size(group: dist.ProcessGroup | None) -> int:
    return dist.get_world_size(group) if group is not None else 1


def _gather(entry: ExportEntry, shard: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """The merged tensor from every rank's shard of `group` (TP, or expert-TP for an expert's weight)."""
    size = _size(group)
    if size == 1 or entry.tp_split == REPLICATED:
        return shard
    parts = [torch.empty_like(shard) for _ in range(size)]
    dist.all_gather(parts, shard.contiguous(), group=group)
    return tp_merge(entry.tp_split, parts)


def _broadcast(merged: torch.Tensor, src_group_rank: int, group: dist.ProcessGroup | None) -> torch.Tensor:
    if _size(group) > 1:
        merged = merged.contiguous()
        dist.broadcast(merged, src=dist.get_global_rank(group, src_group_rank), group=group)
    return merged


def iter_hf_weights(
    plan: Sequence[ExportEntry],
    dims: ModelDims,
    local_params: Sequence[dict[str, torch.Tensor]],
    groups: ExportGroups,
    dtype: torch.dtype,
    device: torch.device,
) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, full tensor) for every entry of `plan`, identical on every rank of the TP × PP (× EP) groups.

    `local_params[chunk][local_name]` are this rank's shards (local-spec names). Collective: every rank of the
    groups must iterate to the end. An expert's weight is gathered over the expert-TP group of the expert-parallel
    rank holding it, then broadcast over the expert-parallel group, then over the pipeline.
    """
    for entry in plan:
        expert = entry.spec.expert is not None
        held = entry.pp_rank == groups.pp_rank and (not expert or entry.ep_rank == groups.ep_rank)
        if held:
            shard = local_params[entry.chunk][entry.local_name].detach().to(device=device, dtype=dtype)
            merged = _gather(entry, shard, groups.etp_group if expert else groups.tp_group)
        else:
            merged = torch.empty(entry.merged_shape, dtype=dtype, device=device)
        if expert and entry.pp_rank == groups.pp_rank:
            merged = _broadcast(merged, entry.ep_rank, groups.ep_group)
        merged = _broadcast(merged, entry.pp_rank, groups.pp_group)
        yield from split_to_hf(entry.spec, merged, dims)
        del merged
