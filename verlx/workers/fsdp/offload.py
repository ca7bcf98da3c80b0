"""param_offload / optimizer_offload: an FSDP2 model's sharded parameters and optimizer state live in host memory
between phases and come back to the GPU for the phase that computes with them.

Only this rank's shards move (1/N of the model each). What moves is storages: an FSDP2 sharded parameter's padded
flat storage, each optimizer state tensor's (HostStash, verlx/workers/host_stash.py, shared with the megatron
engine). Offloading copies a storage's bytes into its host buffer and frees the
device memory by resizing the storage to zero bytes; loading gives it its bytes back and copies them in. Python
objects never change, so FSDP2's references to its sharded data, the DTensor parameters and the optimizer's state
dict stay valid without re-registration (FSDP2 frees its unsharded parameters the same way). The host buffers are
pinned (page-locked) when CUDA is there, allocated on the first offload of a storage and reused by every later one:
pinned copies run at the link's speed and asynchronously; pageable ones are staged by the driver (the 2026-11-22
measurement: 24.8 s instead of 3.5 s for the 1.5B update, docs/benchmarks.md).

Overlap (`on_device(overlap=True)`, the compute phases): copies to the GPU run on a side stream in the order the
forward needs them, the root FSDP unit (embeddings, output projection) first, then the layers, then the optimizer
state. A unit's forward pre-hook waits for its own parameters only (on the host: FSDP2 gathers on its own streams),
so the first layers compute while later ones are still copied; the optimizer's step pre-hook makes the compute stream
wait for the optimizer state, which no forward or backward needs, so its copy hides behind the whole mini-batch.
Copies to the host run on the compute stream at the phase's end; empty_cache then returns the memory to the driver
(a rollout engine sizing its KV cache from free memory sees it). Non-compute phases (weight push, checkpoints) load
synchronously.

On a CPU-only run there is nothing to offload: `for_config` ignores the settings with one warning per process (the
class itself works on any device, which the CPU tests use). Either way a phase ends with only shards on the device:
the root's parameters, which FSDP keeps gathered after a forward-only pass, are resharded.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch
from torch import nn

from verlx.workers.host_stash import HostStash

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def fsdp_units(module: nn.Module) -> list[tuple[nn.Module, list[nn.Parameter]]]:
    """The FSDP units of `module` in the order a forward visits them (the root, then the others as registered),
    each with the parameters it manages itself; a module without FSDP is one unit."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule) and m is not module]
    units.insert(0, module)
    seen: set[int] = set()
    owned = []
    for unit in reversed(units):  # inner units first: a parameter belongs to the innermost unit holding it
        params = [p for p in unit.parameters() if id(p) not in seen]
        seen.update(id(p) for p in params)
        owned.append((unit, params))
    return owned[::-1]


def optimizer_state_tensors(optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]


class Offloader:
    """Keeps `module`'s parameters (param_offload) and `optimizer`'s state (optimizer_offload) in host memory
    between phases; `with offloader.on_device(optimizer=..., overlap=...):` brings them to `device` for one phase."""

    def __init__(self, role: str, module: nn.Module, optimizer, device: torch.device, param_offload: bool,
                 optimizer_offload: bool = False):
        self.role, self.module, self.optimizer, self.device = role, module, optimizer, device
        self.param_offload = param_offload
        self.optimizer_offload = optimizer_offload and optimizer is not None
        self.params_on_device = True
        self.optimizer_on_device = True
        pin = device.type == "cuda"
        self.units = fsdp_units(module) if param_offload else []
        self.param_stashes = [HostStash(device, pin) for _ in self.units]
        self.optimizer_stash = HostStash(device, pin)
        self.bytes_moved = 0  # by the last offload: what each load brings back
        self._stream = torch.cuda.Stream(device) if pin and (param_offload or self.optimizer_offload) else None
        self._pending_units: dict[int, torch.cuda.Event] = {}
        self._pending_optimizer: torch.cuda.Event | None = None
        for unit, _ in self.units:
            unit.register_forward_pre_hook(self._before_unit, prepend=True)  # before FSDP's own pre-forward
        if self.optimizer_offload:
            optimizer.register_step_pre_hook(self._before_step)

    @classmethod
    def for_config(cls, role: str, module: nn.Module, optimizer, device: torch.device, param_offload: bool,
                   optimizer_offload: bool = False) -> Offloader:
        """The engine's offloader: on a CPU-only run the settings are ignored, with one warning per process."""
        if (param_offload or optimizer_offload) and device.type != "cuda":
            if "cpu" not in _warned:
                _warned.add("cpu")
                logger.warning("%s: fsdp_config.param_offload / optimizer_offload are ignored on a CPU-only run "
                               "(the model already lives in host memory)", role)
            param_offload = optimizer_offload = False
        return cls(role, module, optimizer, device, param_offload, optimizer_offload)

    # ------------------------------------------------------------------ waiting for copies in flight
    def _before_unit(self, unit: nn.Module, args) -> None:
        event = self._pending_units.pop(id(unit), None)
        if event is not None:
            event.synchronize()

    def _before_step(self, optimizer, args, kwargs) -> None:
        if self._pending_optimizer is not None:
            torch.cuda.current_stream(self.device).wait_event(self._pending_optimizer)
            self._pending_optimizer = None

    def _wait_all(self) -> None:
        for event in self._pending_units.values():
            event.synchronize()
        self._pending_units.clear()
        if self._pending_optimizer is not None:
            self._pending_optimizer.synchronize()
            self._pending_optimizer = None

    # ------------------------------------------------------------------ moving
    def offload(self) -> None:
        """Move what is configured to host memory and release the freed device memory. The root's parameters,
        gathered after a forward-only pass (see apply_fsdp2), are resharded first in any case."""
        reshard = getattr(self.module, "reshard", None)
        if reshard is not None:
            reshard()
        if not (self.param_offload or self.optimizer_offload):
            return
        self._wait_all()  # a copy still in flight (a unit no forward reached) lands before its storage is read
        moved = 0
        if self.param_offload and self.params_on_device:
            moved += sum(stash.stash(params) for (_, params), stash in zip(self.units, self.param_stashes))
            self.params_on_device = False
        if self.optimizer_offload and self.optimizer_on_device:
            moved += self.optimizer_stash.stash(optimizer_state_tensors(self.optimizer))
            self.optimizer_on_device = False
        self.bytes_moved = moved or self.bytes_moved
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def load(self, optimizer: bool = False, overlap: bool = False) -> None:
        """Bring the parameters (and, with `optimizer`, the optimizer state) back; with `overlap`, return as soon as
        the copies are queued and let each consumer wait for its own part."""
        stream = self._stream if overlap else None
        if self.param_offload and not self.params_on_device:
            for (unit, _), stash in zip(self.units, self.param_stashes):
                event = stash.restore(stream)
                if event is not None:
                    self._pending_units[id(unit)] = event
            self.params_on_device = True
        if optimizer and self.optimizer_offload and not self.optimizer_on_device:
            self._pending_optimizer = self.optimizer_stash.restore(stream)
            self.optimizer_on_device = True
        if not overlap:
            self._wait_all()

    @contextmanager
    def on_device(self, optimizer: bool = False, overlap: bool = False):
        """Parameters (and optimizer state) on the device for the block; offloaded again after it."""
        self.load(optimizer, overlap)
        try:
            yield
        finally:
            self.offload()

    def host_allocations(self) -> int:
        """Host buffers allocated so far (constant once every storage has moved once)."""
        return self.optimizer_stash.allocations + sum(s.allocations for s in self.param_stashes)
