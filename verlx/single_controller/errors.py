"""Errors the driver raises for worker trouble: each names the group, the method and the ranks."""

from __future__ import annotations

import re

from verlx.utils.errors import VerlxError

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class WorkerGroupError(VerlxError, RuntimeError):
    """Base class: something went wrong inside a worker group call."""


class WorkerCallError(WorkerGroupError):
    """A worker method raised; carries the remote traceback."""

    def __init__(self, group: str, method: str, rank: int, remote_traceback: str):
        remote_traceback = _ANSI.sub("", remote_traceback)
        self.group, self.method, self.rank, self.remote_traceback = group, method, rank, remote_traceback
        super().__init__(f"{group}.{method} raised on rank {rank}:\n{remote_traceback}")

    @property
    def exit_code(self) -> int:
        cause = self.__cause__
        return cause.exit_code if isinstance(cause, VerlxError) else 1

    def summary(self) -> str:
        """The worker's own message when it raised a VerlxError, else the exception lines of its traceback."""
        cause = self.__cause__
        text = cause.summary() if isinstance(cause, VerlxError) else exception_lines(self.remote_traceback)
        return f"{self.group}.{self.method} failed on rank {self.rank}: {text}"

    def details(self) -> str:
        return self.remote_traceback


def exception_lines(formatted_traceback: str) -> str:
    """The exception's own lines of a formatted traceback: what follows its last frame (and the frame's source
    lines), e.g. 'ValueError: Invalid learning rate: -0.001' and any note after it."""
    lines = formatted_traceback.rstrip().splitlines()
    frames = [i for i, line in enumerate(lines) if line.startswith("  File ")]
    start = frames[-1] + 1 if frames else 0
    while start < len(lines) and lines[start].startswith((" ", "\t")):
        start += 1
    return "\n".join(lines[start:]).strip() or formatted_traceback.strip()


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

    def summary(self) -> str:
        return (f"{self.group}.{self.method} did not finish within {self.timeout_s:g}s (trainer.phase_timeout_s or "
                f"trainer.phase_timeouts.{self.method}); ranks still running: {self.running_ranks}; their stacks "
                "show where they are")

    def details(self) -> str:
        return str(self)
