"""Run untrusted code in a subprocess with CPU-time, memory, output and wall-clock limits and no network.

The child is a fresh isolated interpreter (`python -I`) in its own session and an empty temporary directory.
Limits: RLIMIT_CPU (cpu_time_s), RLIMIT_AS (memory_mb), RLIMIT_FSIZE (files it may write), RLIMIT_CORE 0; the
parent kills the whole process group after wall_s. Network: the child first tries to enter a new network
namespace (unshare(CLONE_NEWNET): no interfaces at all, needs root or user namespaces); where that is refused it
replaces the socket module's constructors so every connection attempt raises. That fallback is a guard against
accidents, not a security boundary: run untrusted models' code in a container for real isolation.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import tempfile
import time
from dataclasses import dataclass

# Runs first in the child: leave the network, then hand control to the user code read from stdin.
_PRELUDE = r"""
import ctypes, socket, sys
try:
    if ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0:
        raise OSError("unshare refused")
except Exception:
    def _refuse(*args, **kwargs):
        raise OSError("network access is disabled in the verlx sandbox")
    socket.socket = socket.create_connection = socket.socketpair = _refuse
    socket.getaddrinfo = _refuse
code = sys.stdin.read()
sys.stdin = open("/dev/null")
del ctypes
exec(compile(code, "<tool code>", "exec"), {"__name__": "__main__"})
"""


@dataclass(frozen=True)
class SandboxLimits:
    cpu_time_s: float = 5.0
    memory_mb: int = 512
    wall_s: float = 10.0
    max_output_bytes: int = 16384
    max_file_bytes: int = 1 << 20


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool
    output_truncated: bool
    wall_s: float

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out


def _limit(limits: SandboxLimits):
    def apply() -> None:
        import resource

        cpu = max(1, int(limits.cpu_time_s + 0.999))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
        memory = int(limits.memory_mb) << 20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.max_file_bytes, limits.max_file_bytes))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    return apply


async def _read_capped(stream: asyncio.StreamReader, cap: int) -> tuple[bytes, bool]:
    """Up to cap bytes; the rest is drained (so the child never blocks on a full pipe) and dropped."""
    kept, truncated = bytearray(), False
    while chunk := await stream.read(65536):
        room = cap - len(kept)
        if len(chunk) > room:
            truncated = True
        kept += chunk[: max(room, 0)]
    return bytes(kept), truncated


async def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxResult:
    """Execute `code` in a limited child interpreter; never raises for what the code does."""
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="verlx_sandbox_") as workdir:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-c", _PRELUDE,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=workdir, env={"PATH": os.environ.get("PATH", ""), "PYTHONIOENCODING": "utf-8"},
            preexec_fn=_limit(limits), start_new_session=True,
        )
        proc.stdin.write(code.encode())
        proc.stdin.close()
        readers = asyncio.gather(_read_capped(proc.stdout, limits.max_output_bytes),
                                 _read_capped(proc.stderr, limits.max_output_bytes), proc.wait())
        timed_out = False
        try:
            (out, out_cut), (err, err_cut), _ = await asyncio.wait_for(readers, limits.wall_s)
        except asyncio.TimeoutError:
            timed_out = True
            _kill_group(proc.pid)
            await proc.wait()
            out, err, out_cut, err_cut = b"", b"", False, False
    return SandboxResult(out.decode(errors="replace"), err.decode(errors="replace"), proc.returncode, timed_out,
                         out_cut or err_cut, time.perf_counter() - start)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
