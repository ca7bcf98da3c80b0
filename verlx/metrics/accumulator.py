"""Metric bookkeeping inside workers: accumulate on device, one host sync and one all-reduce per call."""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.distributed as dist


class MetricAccumulator:
    """Per-step sums (one step = one optimizer step), averaged over steps and over ranks at the end.

    Every value is kept on the accumulator's device, whatever device it comes from (megatron's optimizer returns
    its gradient norm as a Python float, the losses are CUDA tensors): the reduction stacks them all."""

    def __init__(self, device: torch.device):
        self.device = device
        self._current: dict[str, torch.Tensor] = defaultdict(lambda: torch.zeros((), device=device))
        self._steps: dict[str, list[torch.Tensor]] = defaultdict(list)
        self._counts: dict[str, int] = defaultdict(int)
        self._constants: dict[str, float] = {}
        self._maxima: dict[str, torch.Tensor] = {}  # over every step and rank; a minimum is kept as -max(-value)
        self._minima: dict[str, torch.Tensor] = {}

    def _on_device(self, value: torch.Tensor | float) -> torch.Tensor:
        return torch.as_tensor(value, dtype=torch.float32).to(self.device, non_blocking=True).reshape(())

    def add_sum(self, name: str, value: torch.Tensor | float) -> None:
        self._current[name] = self._current[name] + self._on_device(value)

    def add_mean(self, name: str, value: torch.Tensor | float) -> None:
        self._steps[name].append(self._on_device(value))

    def add_count(self, name: str) -> None:
        self._counts[name] += 1

    def add_max(self, name: str, value: torch.Tensor | float) -> None:
        """The largest value of the whole call, over all ranks (not a mean)."""
        value = self._on_device(value)
        self._maxima[name] = value if name not in self._maxima else torch.maximum(self._maxima[name], value)

    def add_min(self, name: str, value: torch.Tensor | float) -> None:
        """The smallest value of the whole call, over all ranks (not a mean)."""
        value = -self._on_device(value)
        self._minima[name] = value if name not in self._minima else torch.maximum(self._minima[name], value)

    def set(self, name: str, value: float) -> None:
        self._constants[name] = float(value)

    def end_step(self) -> None:
        for name, value in self._current.items():
            self._steps[name].append(value)
        self._current.clear()

    def local_means(self) -> tuple[list[str], torch.Tensor]:
        """This rank's metric names (sorted) and their means over steps, one float64 tensor on the device."""
        self.end_step()
        names = sorted(self._steps)
        if not names:
            return names, torch.zeros(0, dtype=torch.float64, device=self.device)
        return names, torch.stack([torch.stack(self._steps[n]).mean() for n in names]).double()

    def reduce(self, group: dist.ProcessGroup | None = None) -> dict[str, float]:
        """Mean over steps, then mean over the ranks of `group` (default: all; every one of them must call this)."""
        names, values = self.local_means()
        out: dict[str, float] = dict(self._constants)
        if names:
            if dist.is_initialized():
                dist.all_reduce(values, group=group)
                values /= dist.get_world_size(group)
            out.update(dict(zip(names, values.tolist())))
        out.update({name: float(count) for name, count in self._counts.items()})
        out.update(self._reduce_extremes(group))
        return out

    def _reduce_extremes(self, group: dist.ProcessGroup | None) -> dict[str, float]:
        names = sorted(self._maxima) + sorted(self._minima)
        if not names:
            return {}
        values = torch.stack([self._maxima[n] for n in sorted(self._maxima)]
                             + [self._minima[n] for n in sorted(self._minima)]).double()
        if dist.is_initialized():  # every rank records the same names, as for the means
            dist.all_reduce(values, op=dist.ReduceOp.MAX, group=group)
        signs = [1.0] * len(self._maxima) + [-1.0] * len(self._minima)
        return {name: sign * value for name, sign, value in zip(names, signs, values.tolist())}
