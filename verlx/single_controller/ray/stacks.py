"""Read the Python stacks of worker processes that are stuck, from the driver."""

from __future__ import annotations

import os
import shutil
import subprocess
import time

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from verlx.single_controller.worker import STACK_DUMP_SIGNAL, stack_file_path


def _dump_stack_local(pid: int, settle_s: float = 0.5) -> str:
    """py-spy when installed (also shows native frames); else the worker's faulthandler via a signal."""
    py_spy = shutil.which("py-spy")
    if py_spy:
        try:
            result = subprocess.run([py_spy, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=20)
            if result.returncode == 0 and result.stdout.strip():
                return result.stdout
        except (subprocess.TimeoutExpired, OSError):
            pass
    path = stack_file_path(pid)
    try:
        before = os.path.getsize(path)
        os.kill(pid, STACK_DUMP_SIGNAL)
    except (OSError, ProcessLookupError) as e:
        return f"(could not signal pid {pid}: {e})"
    deadline = time.monotonic() + settle_s * 6
    while time.monotonic() < deadline:
        time.sleep(settle_s / 5)
        if os.path.getsize(path) > before:
            time.sleep(settle_s / 5)
            break
    with open(path) as f:
        f.seek(before)
        return f.read() or "(the worker wrote no stack)"


@ray.remote(num_cpus=0)
def _dump_stack_task(pid: int) -> str:
    return _dump_stack_local(pid)


def dump_stacks(identities: dict[int, object], timeout_s: float = 30.0) -> dict[int, str]:
    """rank -> stack text, for the given rank -> WorkerIdentity, each read on the worker's own node."""
    refs = {
        rank: _dump_stack_task.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=ident.node_id, soft=False)
        ).remote(ident.pid)
        for rank, ident in identities.items()
    }
    out = {}
    for rank, ref in refs.items():
        try:
            out[rank] = ray.get(ref, timeout=timeout_s)
        except Exception as e:  # a failed dump must not hide the timeout it explains
            out[rank] = f"(stack dump failed: {type(e).__name__}: {e})"
    return out

