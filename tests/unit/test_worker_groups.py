"""The worker groups declare their methods (no binding at run time): every @register-ed method of a worker class has
its line in the group class the drivers use, under its own name and with the worker's dispatch, and nothing else."""

from __future__ import annotations

import pytest

from verlx.single_controller import Dispatch, Worker, register
from verlx.single_controller.ray import RayWorkerGroup, group_method
from verlx.single_controller.ray.worker_group import registered_methods
from verlx.workers.groups import ROLE_GROUPS


@pytest.mark.parametrize("role", list(ROLE_GROUPS))
def test_every_registered_worker_method_is_declared_in_its_group(role):
    group_cls, worker_cls = ROLE_GROUPS[role]
    declared = group_cls.group_methods()
    registered = registered_methods(worker_cls)
    assert sorted(declared) == sorted(registered)
    for name, method in declared.items():
        assert method.spec == registered[name] and method.fn is getattr(worker_cls, name)


class Toy(Worker):
    @register(Dispatch.ONE_TO_ALL)
    def ping(self):
        return self.rank

    def helper(self):
        return None


def test_a_group_method_must_name_a_registered_method_under_its_own_name():
    with pytest.raises(TypeError, match="Toy.helper is not a @register-ed worker method"):
        group_method(Toy.helper)
    with pytest.raises(TypeError, match=r"RayWorkerGroup.pong = group_method\(Toy.ping\): a group method has the "):
        group_method(Toy.ping).__set_name__(RayWorkerGroup, "pong")  # what `pong = group_method(...)` runs


def test_a_group_that_declares_what_its_worker_lacks_is_refused_when_built():
    class Other(Worker):
        @register(Dispatch.RANK_ZERO)
        def ping(self):
            return 0

    class ToyGroup(RayWorkerGroup):
        ping = group_method(Toy.ping)

    ToyGroup._check_methods(registered_methods(Toy), "Toy")
    with pytest.raises(TypeError, match="ToyGroup.ping calls .*Toy.ping, which Other does not register under that name "
                                        "with the same dispatch"):
        ToyGroup._check_methods(registered_methods(Other), "Other")
