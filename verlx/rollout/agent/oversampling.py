"""actor_rollout_ref.rollout.over_sample_rate (veRL's key): stop waiting for the slowest samples of a batch.

veRL added it to its SGLang multi-turn rollout (volcengine/verl PR #2929): of a worker's N requests, once
int(N × (1 - over_sample_rate)) have completed, the ones still running are cancelled, the engine is told to abort
them, and each comes back as a padding sample with an empty response (zero loss mask) that stays in the batch;
validation is never cut. veRL 0.9.1 still declares the key (same threshold in its config docs) and still logs
`response/aborted_ratio`, the share of samples with an empty response. verlx does the same per rollout worker,
and also never cuts greedy calls (REMAX's baseline needs every prompt).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable


def samples_to_keep(total: int, rate: float) -> int:
    """veRL's threshold int(total × (1 - rate)); at least one sample always finishes."""
    return max(1, int(total * (1 - rate)))


async def finish_first(tasks: list[asyncio.Task], keep: int, cut: Callable[[], None]) -> list[bool]:
    """Run `tasks` until `keep` of them have finished, then call `cut` (the engine aborts what is in flight) and
    cancel the others; returns, per task, whether it was cancelled. The cut happens when the keep-th task's
    completion is delivered, so every task that finished in the same event-loop round (samples whose last request
    ended in the same engine step) is kept, as veRL keeps every request already done when it cancels."""
    finished = 0

    def on_done(task: asyncio.Task) -> None:
        nonlocal finished
        if task.cancelled():
            return
        finished += 1
        if finished == keep:
            cut()
            for other in tasks:
                if not other.done():
                    other.cancel()

    for task in tasks:
        task.add_done_callback(on_done)
    await asyncio.gather(*tasks, return_exceptions=True)
    return [task.cancelled() for task in tasks]
