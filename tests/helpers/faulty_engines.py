"""Rollout engines that misbehave on purpose, for fault-injection tests (rollout.name=helpers.faulty_engines:X).

They run inside the real Ray workers; engine_kwargs.custom says when to misbehave.
"""

from __future__ import annotations

import errno
import os
import signal
import time

from verlx.rollout.hf_engine import HFEngine
from verlx.rollout.native.engine import NativeEngine


class _StepEngine(HFEngine):
    def _step(self, prompts) -> int:
        return int(prompts.meta_info.get("global_step", 0))

    def _option(self, key, default=None):
        return self.config.engine_kwargs.custom.get(key, default)


class HangingEngine(_StepEngine):
    """Generation never returns from step `hang_at_step` on."""

    def generate(self, prompts):
        if self._step(prompts) >= self._option("hang_at_step", 1):
            while True:
                time.sleep(1.0)
        return super().generate(prompts)


class DyingOnceEngine(_StepEngine):
    """Rank `rank` SIGKILLs its own process at step `die_at_step`, once (a marker file remembers it happened)."""

    def generate(self, prompts):
        marker = self._option("marker")
        if (self._step(prompts) == self._option("die_at_step") and self.ctx.rank == self._option("rank", 0)
                and not os.path.exists(marker)):
            with open(marker, "w") as f:
                f.write("died\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return super().generate(prompts)


class DiskFullEngine(_StepEngine):
    """From step `full_at_step` on, every checkpoint write in this process fails as if the disk were full."""

    def generate(self, prompts):
        if self._step(prompts) >= self._option("full_at_step", 1):
            import torch.distributed.checkpoint as dcp

            def disk_full(*args, **kwargs):
                raise OSError(errno.ENOSPC, "No space left on device (simulated)")

            dcp.save = disk_full
        return super().generate(prompts)


class SlowEngine(_StepEngine):
    """Every generation takes `delay_s` longer (generation and training overlap visibly in one_step_off)."""

    def generate(self, prompts):
        time.sleep(float(self._option("delay_s", 1.0)))
        return super().generate(prompts)


class SlowNativeEngine(NativeEngine):
    """The native engine with each decode round of its request streams slowed by `round_delay_s`: a generation
    that is still running when the weights change (partial rollout)."""

    def _open_stream(self, params, partial):
        stream = super()._open_stream(params, partial)
        delay = float(self.config.engine_kwargs.custom.get("round_delay_s", 0.05))
        step = stream.step

        def slow_step():
            time.sleep(delay)
            return step()

        stream.step = slow_step
        return stream
