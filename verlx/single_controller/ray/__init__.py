"""The Ray implementation of the single-controller runtime."""

from verlx.single_controller.ray.colocate import create_colocated_worker_cls
from verlx.single_controller.ray.resource_pool import RayResourcePool
from verlx.single_controller.ray.worker_group import (
    GroupFuture,
    GroupMethod,
    RayClassWithInitArgs,
    RayWorkerGroup,
    group_method,
)

__all__ = ["GroupFuture", "GroupMethod", "RayClassWithInitArgs", "RayResourcePool", "RayWorkerGroup",
           "create_colocated_worker_cls", "group_method"]
