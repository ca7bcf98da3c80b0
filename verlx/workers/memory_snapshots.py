"""torch's CUDA memory history in a worker process (veRL's tool=torch_memory): each recorded phase call runs with the
caching allocator's history on, and its snapshot — every live block and the allocations and frees of the call, with
their stacks — is written when the call ends, also when it fails (an out-of-memory error is what one usually wants
to see). Open the file in https://pytorch.org/memory_viz."""

from __future__ import annotations

import logging
import os
from contextlib import contextmanager

import torch

from verlx.workers.profile_plan import ProfiledCall, ProfilePlan

logger = logging.getLogger(__name__)


class MemorySnapshots:
    """tool=torch_memory: `<phase>_step<N>_rank<R>.pickle` of each recorded call; nothing spans calls."""

    @contextmanager
    def record(self, call: ProfiledCall, device: torch.device):
        history = call.memory
        torch.cuda.memory._record_memory_history(enabled="all", context=history.context, stacks=history.stacks,
                                                 max_entries=history.max_entries, device=device,
                                                 **dict(history.extra))
        try:
            yield
        finally:
            os.makedirs(call.directory, exist_ok=True)
            path = os.path.join(call.directory, f"{call.name}.pickle")
            torch.cuda.memory._dump_snapshot(path)
            torch.cuda.memory._record_memory_history(enabled=None, device=device)
            logger.info("CUDA memory snapshot of %s (%s): %s", call.phase, call.name, path)

    def step_starts(self, step: int, plan: ProfilePlan) -> None:
        """Each snapshot ends with its call: nothing to end when a step starts."""

    def finish(self) -> None:
        """Each snapshot ends with its call: nothing to end when the worker closes."""
