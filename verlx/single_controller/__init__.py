"""Single-controller runtime: one driver drives groups of Ray worker processes as if they were one object."""

from verlx.single_controller.decorator import Dispatch, register, register_dispatch_mode
from verlx.single_controller.errors import PhaseTimeoutError, WorkerCallError, WorkerDiedError, WorkerGroupError
from verlx.single_controller.worker import Worker

__all__ = [
    "Dispatch",
    "PhaseTimeoutError",
    "Worker",
    "WorkerCallError",
    "WorkerDiedError",
    "WorkerGroupError",
    "register",
    "register_dispatch_mode",
]
