"""Colocation: several worker roles constructed inside one Ray actor per bundle (one process per GPU)."""

from __future__ import annotations

import functools

from verlx.single_controller.decorator import METHOD_SPEC_ATTR
from verlx.single_controller.ray.worker_group import RayClassWithInitArgs, registered_methods
from verlx.single_controller.worker import Worker


def _delegate(role: str, name: str, spec):
    def method(self, *args, **kwargs):
        return getattr(self.worker_dict[role], name)(*args, **kwargs)

    method.__name__ = f"{role}_{name}"
    setattr(method, METHOD_SPEC_ATTR, spec)
    return method


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """One WorkerDict class whose constructor builds every role; role methods are exposed as `role_method`.

    Use `RayWorkerGroup(pool, create_colocated_worker_cls(...)).spawn({role: cls})` to get per-role views
    whose methods drop the prefix.
    """
    if not class_dict:
        raise ValueError("create_colocated_worker_cls needs at least one role")
    for role in class_dict:
        if not role.isidentifier():
            raise ValueError(f"role name {role!r} must be a Python identifier")
    specs = {role: (rc.cls, rc.args, rc.kwargs) for role, rc in class_dict.items()}

    class WorkerDict(Worker):
        def __init__(self, role_specs=specs):
            super().__init__()
            self.worker_dict = {role: cls(*args, **kwargs) for role, (cls, args, kwargs) in role_specs.items()}

        def close(self) -> None:
            for worker in self.worker_dict.values():
                worker.close()

    for role, rc in class_dict.items():
        for name, spec in registered_methods(rc.cls).items():
            setattr(WorkerDict, f"{role}_{name}", _delegate(role, name, spec))
    WorkerDict.__qualname__ = WorkerDict.__name__ = "WorkerDict_" + "_".join(class_dict)

    env = functools.reduce(lambda acc, rc: {**acc, **rc.env_vars}, class_dict.values(), {})
    fields = functools.reduce(lambda acc, rc: {**acc, **rc.runtime_env}, class_dict.values(), {})
    return RayClassWithInitArgs(WorkerDict).with_env(**env).with_runtime_env(**fields)
