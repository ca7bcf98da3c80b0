"""How a driver-side call on a worker group becomes per-rank calls, and how their results come back.

`@register(dispatch_mode=...)` marks a worker method as a group method. A dispatch mode is a pair of
functions: `dispatch` plans which ranks are called with which arguments, `collect` turns the per-rank
results into what the driver sees. Modes live in a registry so new ones can be added without touching
the worker group.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from verlx.protocol import DataProto
from verlx.utils.registry import Registry

METHOD_SPEC_ATTR = "_verlx_method_spec"
DEFAULT_MESH = "default"


class Dispatch(str, Enum):
    ONE_TO_ALL = "one_to_all"  # same arguments to every rank; list of results
    ALL_TO_ALL = "all_to_all"  # same as ONE_TO_ALL: every rank called with the arguments as given
    DP_COMPUTE = "dp_compute"  # every argument is a list with one entry per rank; list of results
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto split by data-parallel rank; results concatenated
    RANK_ZERO = "rank_zero"  # only rank 0 is called; its result


class WorkerGroupLike(Protocol):
    world_size: int

    def dispatch_info(self, mesh: str) -> list[tuple[int, int, bool]]: ...


@dataclass
class DispatchPlan:
    """Which ranks to call with which arguments, plus what `collect` needs to undo the split."""

    calls: list[tuple[int, tuple, dict]]
    context: dict = field(default_factory=dict)

    @property
    def ranks(self) -> list[int]:
        return [rank for rank, _, _ in self.calls]


@dataclass(frozen=True)
class DispatchMode:
    dispatch: Callable[[WorkerGroupLike, str, str, tuple, dict], DispatchPlan]
    collect: Callable[[WorkerGroupLike, DispatchPlan, list], Any]


DISPATCH_MODES: Registry[DispatchMode] = Registry("dispatch mode")


def register_dispatch_mode(name: str, dispatch, collect) -> None:
    """Add a dispatch mode: dispatch(group, method, mesh, args, kwargs) -> DispatchPlan,
    collect(group, plan, outputs) -> result."""
    DISPATCH_MODES.register(name)(DispatchMode(dispatch, collect))


@dataclass(frozen=True)
class MethodSpec:
    dispatch_mode: str
    blocking: bool
    mesh: str


def register(dispatch_mode: Dispatch | str = Dispatch.ALL_TO_ALL, blocking: bool = True, mesh: str = DEFAULT_MESH):
    """Mark a worker method as a group method.

    `mesh` names the data-parallel layout DP_COMPUTE_PROTO splits by: workers declare their place in it with
    `Worker.set_dispatch_info(mesh, dp_rank, dp_size, is_collect)` (tensor-parallel peers share a dp_rank, and
    only one of them has is_collect=True).
    """
    mode = dispatch_mode.value if isinstance(dispatch_mode, Dispatch) else str(dispatch_mode)
    DISPATCH_MODES.get(mode)  # fail at import time on a typo, not at the first call

    def decorator(fn):
        setattr(fn, METHOD_SPEC_ATTR, MethodSpec(mode, blocking, mesh))
        return fn

    return decorator


def method_spec(fn) -> MethodSpec | None:
    return getattr(fn, METHOD_SPEC_ATTR, None)


# ---------------------------------------------------------------------- built-in modes
def _all_ranks(group, method, mesh, args, kwargs) -> DispatchPlan:
    return DispatchPlan([(rank, args, kwargs) for rank in range(group.world_size)])


def _as_list(group, plan, outputs):
    return list(outputs)


def _dp_compute(group, method, mesh, args, kwargs) -> DispatchPlan:
    for position, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, (list, tuple)) or len(value) != group.world_size:
            raise TypeError(
                f"{method} uses DP_COMPUTE: argument {position!r} must be a list with one entry per rank "
                f"({group.world_size}), got {type(value).__name__}"
                + (f" of length {len(value)}" if isinstance(value, (list, tuple)) else "")
            )
    return DispatchPlan(
        [
            (rank, tuple(a[rank] for a in args), {k: v[rank] for k, v in kwargs.items()})
            for rank in range(group.world_size)
        ]
    )


def _dp_compute_proto(group, method, mesh, args, kwargs) -> DispatchPlan:
    infos = group.dispatch_info(mesh)
    dp_size = infos[0][1]
    shards: dict[Any, list[DataProto]] = {}
    pad_size = None
    for position, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, DataProto):
            raise TypeError(
                f"{method} uses DP_COMPUTE_PROTO: argument {position!r} must be a DataProto, got {type(value).__name__}"
                " (pass options in meta_info)"
            )
        if len(value) < dp_size:
            raise ValueError(
                f"{method}: a DataProto of {len(value)} rows cannot be split across {dp_size} data-parallel ranks "
                f"(mesh '{mesh}'); give it at least {dp_size} rows"
            )
        padded, pad = value.pad_to_divisor(dp_size)
        if pad_size is not None and pad != pad_size:
            raise ValueError(f"{method}: DataProto arguments have different lengths")
        pad_size = pad
        shards[position] = padded.chunk(dp_size)
    calls = []
    for rank, (dp_rank, _, _) in enumerate(infos):
        rank_args = tuple(shards[i][dp_rank] for i in range(len(args)))
        rank_kwargs = {k: shards[k][dp_rank] for k in kwargs}
        calls.append((rank, rank_args, rank_kwargs))
    return DispatchPlan(calls, {"pad_size": pad_size or 0, "infos": infos})


def _collect_dp_proto(group, plan, outputs):
    infos = plan.context["infos"]
    collected = sorted(
        ((infos[rank][0], out) for rank, out in zip(plan.ranks, outputs) if infos[rank][2]), key=lambda x: x[0]
    )
    parts = [out for _, out in collected]
    if not parts or parts[0] is None:
        return None
    if not all(isinstance(p, DataProto) for p in parts):
        return parts
    return DataProto.concat(parts).unpad(plan.context["pad_size"])


def _rank_zero(group, method, mesh, args, kwargs) -> DispatchPlan:
    return DispatchPlan([(0, args, kwargs)])


def _first(group, plan, outputs):
    return outputs[0]


register_dispatch_mode(Dispatch.ONE_TO_ALL.value, _all_ranks, _as_list)
register_dispatch_mode(Dispatch.ALL_TO_ALL.value, _all_ranks, _as_list)
register_dispatch_mode(Dispatch.DP_COMPUTE.value, _dp_compute, _as_list)
register_dispatch_mode(Dispatch.DP_COMPUTE_PROTO.value, _dp_compute_proto, _collect_dp_proto)
register_dispatch_mode(Dispatch.RANK_ZERO.value, _rank_zero, _first)
