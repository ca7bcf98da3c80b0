"""RayWorkerGroup: one Ray actor per bundle, driven as one object from the single controller.

A group's methods are declared in its class, one line per worker method (`update_actor =
group_method(ActorRolloutRefWorker.update_actor)`), so a reader goes from `wg.update_actor(...)` to that line and on
to the worker's method; calling one runs the worker method on the group's ranks as its @register says.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verlx.single_controller.decorator import DISPATCH_MODES, DispatchPlan, MethodSpec, method_spec
from verlx.single_controller.errors import PhaseTimeoutError, WorkerCallError, WorkerDiedError
from verlx.single_controller.ray.resource_pool import RayResourcePool
from verlx.single_controller.ray.stacks import dump_stacks
from verlx.utils.distributed import HOSTED_RENDEZVOUS_ENV

_PEER_DEATH_GRACE_S = 5.0  # how long a failed call waits for its peers to report a death
_POLL_S = 0.5
_CLOSE_TIMEOUT_S = 40.0  # how long shutdown waits for the workers to close (an engine server stops within 30 s)


class RayClassWithInitArgs:
    """A worker class plus the arguments its constructor gets in every actor."""

    def __init__(self, cls: type, *args, **kwargs):
        self.cls, self.args, self.kwargs = cls, args, kwargs
        self.env_vars: dict[str, str] = {}
        #: runtime_env fields of every actor besides env_vars (e.g. nsight), on top of ray.init's runtime_env
        self.runtime_env: dict[str, Any] = {}
        self.max_concurrency = 1

    def with_env(self, **env_vars: str) -> RayClassWithInitArgs:
        self.env_vars.update({k: str(v) for k, v in env_vars.items()})
        return self

    def with_runtime_env(self, **fields: Any) -> RayClassWithInitArgs:
        """Start every actor with these runtime_env fields (e.g. nsight=<nsys profile options>)."""
        self.runtime_env.update(fields)
        return self

    def actor_runtime_env(self, env_vars: dict[str, str]) -> dict[str, Any]:
        """One actor's runtime_env: its environment variables and the fields given with with_runtime_env. Ray lays it
        over ray.init's runtime_env (ray_kwargs.ray_init.runtime_env and verlx's variables): fields named here win,
        env_vars are merged."""
        return {**self.runtime_env, "env_vars": env_vars}

    def with_concurrency(self, calls: int) -> RayClassWithInitArgs:
        """Let each actor run up to `calls` method calls at once (threads), e.g. an interrupt beside a generation."""
        self.max_concurrency = int(calls)
        return self


def registered_methods(cls: type) -> dict[str, MethodSpec]:
    return {
        name: spec
        for name, fn in inspect.getmembers(cls, predicate=callable)
        if (spec := method_spec(fn)) is not None
    }


class GroupMethod:
    """A worker's @register method as a method of its group (see the module docstring). `group.name(...)` waits
    for a blocking method's collected result (a non-blocking one returns its GroupFuture); `group.name.submit(...)`
    never waits."""

    def __init__(self, fn: Callable):
        spec = method_spec(fn)
        if spec is None:
            raise TypeError(f"{fn.__qualname__} is not a @register-ed worker method")
        self.fn, self.spec, self.name = fn, spec, fn.__name__
        functools.update_wrapper(self, fn)

    def __set_name__(self, owner: type, name: str) -> None:
        if name != self.name:
            raise TypeError(f"{owner.__name__}.{name} = group_method({self.fn.__qualname__}): a group method has the "
                            "name of the worker method it calls")

    def __get__(self, group: RayWorkerGroup | None, owner: type | None = None):
        return self if group is None else BoundGroupMethod(group, self)


class BoundGroupMethod:
    def __init__(self, group: RayWorkerGroup, method: GroupMethod):
        self.group, self.method = group, method

    def __call__(self, *args, **kwargs):
        future = self.submit(*args, **kwargs)
        return future.get() if self.method.spec.blocking else future

    def submit(self, *args, **kwargs) -> GroupFuture:
        """Call on every rank without waiting, even a method registered as blocking."""
        return self.group._submit(self.method, args, kwargs)


def group_method(fn: Callable) -> GroupMethod:
    """Declare a worker's @register method in its group's class under the same name."""
    return GroupMethod(fn)


class GroupFuture:
    """The pending result of a group call; `get()` waits under the group's watchdog and collects."""

    def __init__(self, group: RayWorkerGroup, method: str, plan: DispatchPlan, refs: list, collect: Callable):
        self.group, self.method, self.plan, self.refs, self._collect = group, method, plan, refs, collect

    def done(self) -> bool:
        """Whether every rank has returned (without waiting)."""
        ready, _ = ray.wait(list(self.refs), num_returns=len(self.refs), timeout=0)
        return len(ready) == len(self.refs)

    def wait(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every rank; whether all have returned."""
        ready, _ = ray.wait(list(self.refs), num_returns=len(self.refs), timeout=timeout_s)
        return len(ready) == len(self.refs)

    def get(self, timeout_s: float | None = None) -> Any:
        timeout_s = self.group.timeout_for(self.method) if timeout_s is None else timeout_s
        outputs = self.group.wait(self.method, self.plan.ranks, self.refs, timeout_s)
        return self._collect(outputs)


class RayWorkerGroup:
    """Creates one actor per bundle of `resource_pool`; subclasses declare the worker methods it offers
    (`group_method`). Blocking methods return the collected result; non-blocking ones return a GroupFuture. Every
    wait runs under a watchdog: a worker that raises surfaces its traceback with group and rank, a dead worker is
    reported within about a second, and a call past its timeout reports the ranks still running and their stacks.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool | None,
        ray_cls_with_init: RayClassWithInitArgs | None,
        name: str = "workers",
        default_timeout_s: float | None = None,
        _existing: RayWorkerGroup | None = None,
        _role: str | None = None,
    ):
        self.name = name
        self.default_timeout_s = default_timeout_s
        self.timeouts: dict[str, float] = {}
        #: a colocated role's methods are `role_method` on the shared actors
        self._remote_prefix = f"{_role}_" if _role else ""
        if _existing is not None:  # a per-role view sharing the actors of a colocated group
            self._workers, self._identities = _existing._workers, _existing._identities
            self._broken_calls, self._uncollected = _existing._broken_calls, _existing._uncollected
            self._dispatch_cache = _existing._dispatch_cache
            self.resource_pool = _existing.resource_pool
            self.default_timeout_s = _existing.default_timeout_s
            self.timeouts = dict(_existing.timeouts)
        else:
            assert resource_pool is not None and ray_cls_with_init is not None
            self._check_methods(registered_methods(ray_cls_with_init.cls), ray_cls_with_init.cls.__name__)
            self.resource_pool = resource_pool
            #: the calls that timed out or met a dead worker (shared with the per-role views): no close at shutdown
            self._broken_calls: list[str] = []
            #: the refs of calls submitted and not yet collected (shared too): a group still running one is not closed
            self._uncollected: list[list] = []
            self._dispatch_cache: dict[str, list[tuple[int, int, bool]]] = {}
            self._identities: list = []
            self._workers = self._create_workers(resource_pool, ray_cls_with_init)
            self._identities = self.wait(
                "get_identity", list(range(self.world_size)), [w.get_identity.remote() for w in self._workers], None
            )

    @classmethod
    def group_methods(cls) -> dict[str, GroupMethod]:
        """The worker methods this group class declares."""
        return {name: value for klass in reversed(cls.__mro__) for name, value in vars(klass).items()
                if isinstance(value, GroupMethod)}

    @classmethod
    def _check_methods(cls, registered: dict[str, MethodSpec], worker: str) -> None:
        for name, method in cls.group_methods().items():
            if registered.get(name) != method.spec:
                raise TypeError(f"{cls.__name__}.{name} calls {method.fn.__qualname__}, which {worker} does not "
                                "register under that name with the same dispatch")

    # ------------------------------------------------------------------ creation
    def _create_workers(self, pool: RayResourcePool, rcls: RayClassWithInitArgs) -> list:
        remote_cls = ray.remote(rcls.cls)
        slots = pool.slots()
        world = len(slots)
        local_world = {i: n for i, n in enumerate(pool.process_on_nodes)}
        workers, master = [], None
        for rank, slot in enumerate(slots):
            env = {
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": str(slot.bundle_index),
                "LOCAL_WORLD_SIZE": str(local_world[slot.node_index]),
                **rcls.env_vars,
            }
            if master is not None:
                env["MASTER_ADDR"], env["MASTER_PORT"] = master[0], str(master[1])
                env[HOSTED_RENDEZVOUS_ENV] = "1"
            actor = remote_cls.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=slot.placement_group, placement_group_bundle_index=slot.bundle_index
                ),
                runtime_env=rcls.actor_runtime_env(env),
                max_restarts=0,
                **({"max_concurrency": rcls.max_concurrency} if rcls.max_concurrency > 1 else {}),
                **pool.actor_resources(),
            ).remote(*rcls.args, **rcls.kwargs)
            if rank == 0:
                master = self.wait("pick_master_address", [0], [actor.pick_master_address.remote()], None)[0]
            workers.append(actor)
        return workers

    def _submit(self, method: GroupMethod, args: tuple, kwargs: dict) -> GroupFuture:
        spec, remote_name = method.spec, self._remote_prefix + method.name
        mode = DISPATCH_MODES.get(spec.dispatch_mode)
        plan = mode.dispatch(self, method.name, spec.mesh, args, kwargs)
        refs = [getattr(self._workers[rank], remote_name).remote(*a, **kw) for rank, a, kw in plan.calls]
        if len(self._uncollected) >= 64:  # futures never collected: forget those that are done
            self._uncollected[:] = [call for call in self._uncollected if self._running_calls(call)]
        self._uncollected.append(refs)
        return GroupFuture(self, method.name, plan, refs, lambda outs: mode.collect(self, plan, outs))

    # ------------------------------------------------------------------ views
    @property
    def world_size(self) -> int:
        return len(self._workers)

    @property
    def workers(self) -> list:
        return list(self._workers)

    @property
    def identities(self):
        return list(self._identities)

    def spawn(self, roles: dict[str, tuple[type[RayWorkerGroup], type]]) -> dict[str, RayWorkerGroup]:
        """Per-role views of a colocated WorkerDict group, each of its role's group class (given with the role's
        worker class): `views[role].method` calls `role_method` on the shared actors."""
        views = {}
        for role, (group_cls, worker_cls) in roles.items():
            group_cls._check_methods(registered_methods(worker_cls), worker_cls.__name__)
            views[role] = group_cls(None, None, name=role, _existing=self, _role=role)
        return views

    def dispatch_info(self, mesh: str) -> list[tuple[int, int, bool]]:
        """Every rank's (dp_rank, dp_size, is_collect) in `mesh`, asked once and cached."""
        if mesh not in self._dispatch_cache:
            refs = [w.get_dispatch_info.remote(mesh) for w in self._workers]
            infos = self.wait("get_dispatch_info", list(range(self.world_size)), refs, None)
            sizes = {size for _, size, _ in infos}
            if len(sizes) != 1:
                raise RuntimeError(f"{self.name}: ranks disagree on the dp size of mesh '{mesh}': {infos}")
            dp_size = sizes.pop()
            collected = sorted(dp for dp, _, collect in infos if collect)
            if collected != list(range(dp_size)):
                raise RuntimeError(
                    f"{self.name}: mesh '{mesh}' must have exactly one collecting rank per dp rank, got {infos}"
                )
            self._dispatch_cache[mesh] = [tuple(i) for i in infos]
        return self._dispatch_cache[mesh]

    # ------------------------------------------------------------------ calls and watchdog
    def set_timeouts(self, default_s: float | None = None, **per_method_s: float) -> None:
        if default_s is not None:
            self.default_timeout_s = default_s
        self.timeouts.update(per_method_s)

    def timeout_for(self, method: str) -> float | None:
        return self.timeouts.get(method, self.default_timeout_s)

    def execute_all(self, method: str, *args, **kwargs) -> list:
        """Call any worker method on every rank with the same arguments (for methods without @register)."""
        refs = [getattr(w, method).remote(*args, **kwargs) for w in self._workers]
        return self.wait(method, list(range(self.world_size)), refs, self.timeout_for(method))

    def execute_rank(self, rank: int, method: str, *args, **kwargs):
        return self.wait(method, [rank], [getattr(self._workers[rank], method).remote(*args, **kwargs)],
                         self.timeout_for(method))[0]

    def wait(self, method: str, ranks: list[int], refs: list, timeout_s: float | None) -> list:
        """All results in order; the first failure raises at once, naming its rank."""
        try:
            results = self._results(method, ranks, refs, timeout_s)
        except (PhaseTimeoutError, WorkerDiedError):
            self._broken_calls.append(method)
            raise
        self._uncollected[:] = [call for call in self._uncollected if call is not refs]
        return results

    def _running(self) -> bool:
        """Whether a call submitted to this group is still running on a worker (its wait was interrupted by a stop
        signal, or a non-blocking call is in flight): a close would queue behind it."""
        return self._running_calls(*self._uncollected)

    @staticmethod
    def _running_calls(*calls: list) -> bool:
        refs = [ref for call in calls for ref in call]
        if not refs:
            return False
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(ready) < len(refs)

    def _results(self, method: str, ranks: list[int], refs: list, timeout_s: float | None) -> list:
        results: dict[int, Any] = {}
        pending = dict(zip(refs, range(len(refs))))
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while pending:
            wait_s = _POLL_S if deadline is None else max(0.0, min(_POLL_S, deadline - time.monotonic()))
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=wait_s)
            for ref in ready:
                position = pending.pop(ref)
                try:
                    results[position] = self._result_or_raise(method, ranks[position], ref)
                except WorkerCallError:
                    self._raise_if_a_peer_died(method, ranks, pending)
                    raise
            if pending and deadline is not None and time.monotonic() >= deadline:
                running = sorted(ranks[p] for p in pending.values())
                self._raise_if_any_died(method, running)
                stacks = dump_stacks({r: self._identities[r] for r in running}) if self._identities else {}
                raise PhaseTimeoutError(self.name, method, timeout_s, running, stacks)
        return [results[i] for i in range(len(refs))]

    def _result_or_raise(self, method: str, rank: int, ref):
        try:
            return ray.get(ref)
        except RayTaskError as e:
            cause = e.cause if isinstance(e.cause, BaseException) else None
            if isinstance(cause, (RayActorError, ActorDiedError)):
                raise WorkerDiedError(self.name, method, rank, str(cause), self.node_of(rank)) from None
            raise WorkerCallError(self.name, method, rank, str(e)) from cause
        except (ActorDiedError, RayActorError, ActorUnavailableError) as e:
            raise WorkerDiedError(self.name, method, rank, _first_line(str(e)),
                                  self.node_of(rank)) from None

    def _raise_if_a_peer_died(self, method: str, ranks: list[int], pending: dict) -> None:
        """A rank whose collective failed (gloo "connection reset", NCCL errors) is usually collateral damage of a
        peer that died: give the other ranks' calls a moment to report a death, and report that instead."""
        others = dict(pending)
        deadline = time.monotonic() + _PEER_DEATH_GRACE_S
        while others and time.monotonic() < deadline:
            ready, _ = ray.wait(list(others), num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
            for ref in ready:
                rank = ranks[others.pop(ref)]
                try:
                    ray.get(ref)
                except (ActorDiedError, RayActorError, ActorUnavailableError) as e:
                    raise WorkerDiedError(self.name, method, rank, _first_line(str(e)),
                                          self.node_of(rank)) from None
                except RayTaskError as e:
                    if isinstance(e.cause, (ActorDiedError, RayActorError)):
                        raise WorkerDiedError(self.name, method, rank, _first_line(str(e.cause)),
                                              self.node_of(rank)) from None

    def _raise_if_any_died(self, method: str, ranks: list[int]) -> None:
        """A rank stuck in a collective often means a peer died: report the death rather than the hang."""
        for rank in ranks:
            try:
                ray.get(self._workers[rank].__ray_ready__.remote(), timeout=2)
            except (ActorDiedError, RayActorError) as e:
                raise WorkerDiedError(self.name, method, rank, _first_line(str(e)),
                                      self.node_of(rank)) from None
            except ray.exceptions.GetTimeoutError:
                pass

    def node_of(self, rank: int) -> str | None:
        """"node <ip> (<Ray node id>)" of a rank, for messages; None before the workers reported it."""
        if rank >= len(self._identities):
            return None
        ident = self._identities[rank]
        return f"node {ident.node_ip} ({ident.node_id[:12]})"

    def placement(self) -> str:
        """Where the ranks run, one node at a time: "ranks 0-1 on node 10.0.0.1 (9d09...), ranks 2-3 on ..."."""
        parts: list[tuple[str, list[int]]] = []
        for rank in range(len(self._identities)):
            node = self.node_of(rank)
            if parts and parts[-1][0] == node:
                parts[-1][1].append(rank)
            else:
                parts.append((node, [rank]))
        return ", ".join(f"rank{'s' if len(r) > 1 else ''} {r[0]}{f'-{r[-1]}' if len(r) > 1 else ''} on {node}"
                         for node, r in parts)

    def shutdown(self) -> None:
        """Each worker closes (stops what it started outside its process, e.g. an engine server: see Worker.close)
        within _CLOSE_TIMEOUT_S, then all are killed. A group whose call timed out or met a dead worker, or that still
        runs a call (a stop signal interrupted its wait), is killed without closing: its workers may be stuck or busy,
        and what they started stops with them (an engine server's log kept)."""
        if not self._broken_calls and not self._running():
            closing = [w.close.remote() for w in self._workers]
            with contextlib.suppress(ray.exceptions.RayError):  # a worker died, failed to close, or took too long
                ray.get(closing, timeout=_CLOSE_TIMEOUT_S)
        for w in self._workers:
            ray.kill(w, no_restart=True)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else text
