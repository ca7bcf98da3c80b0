"""Errors the driver raises for worker trouble: each names the group, the method and the ranks."""

from __future__ import annotations

import re

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class WorkerGroupError(RuntimeError):
    """Base class: something went wrong inside a worker group call."""


class WorkerCallError(WorkerGroupError):
    """A worker method raised; carries the remote traceback."""

    def __init__(self, group: str, method: str, rank: int, remote_traceback: str):
        remote_traceback = _ANSI.sub("", remote_traceback)
        self.group, self.method, self.rank, self.remote_traceback = group, method, rank, remote_traceback
        super().__init__(f"{group}.{method} raised on rank {rank}:\n{remote_traceback}")


class WorkerDiedError(WorkerGroupError):
    """A worker process is gone (killed, OOM, segfault)."""

    def __init__(self, group: str, method: str, rank: int, detail: str, node: str | None = None):
        self.group, self.method, self.rank, self.node = group, method, rank, node
        where = f" on {node}" if node else ""
        super().__init__(f"{group} rank {rank}{where} died during {method}: {detail}")


class PhaseTimeoutError(WorkerGroupError):
    """A call did not finish within its watchdog timeout; carries the stacks of the ranks still running."""

    def __init__(self, group: str, method: str, timeout_s: float, running_ranks: list[int], stacks: dict[int, str]):
        self.group, self.method, self.timeout_s = group, method, timeout_s
        self.running_ranks, self.stacks = running_ranks, stacks
        parts = [
            f"{group}.{method} did not finish within {timeout_s:g}s; ranks still running: {running_ranks}",
        ]
        for rank in running_ranks:
            parts.append(f"--- rank {rank} stack ---\n{stacks.get(rank, '(no stack available)')}")
        super().__init__("\n".join(parts))
