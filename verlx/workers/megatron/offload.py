"""param_offload / grad_offload / optimizer_offload for megatron models: their state lives in host memory between
phases and comes back to the device for the phases that use it (veRL's megatron keys of the same names).

- param_offload: the storages of the model's parameters. Under megatron's DDP with the distributed optimizer these
  are DDP's contiguous parameter buffers (every parameter is a view of one); without it, and for a model without
  DDP (the reference), each parameter's own storage. Back for every phase.
- grad_offload: DDP's contiguous gradient buffers. Their contents are not kept: between phases they hold the last
  mini-batch's gradients, which the optimizer has already consumed and the next update zeroes before it computes,
  so offloading frees them without a copy and loading allocates them zero-filled (no transfer either way; veRL does
  the same). Back for updates and checkpoints (`optimizer=True`).
- optimizer_offload: the optimizer's fp32 main parameters (those that are not the model's own parameters: with bf16
  weights, megatron keeps fp32 copies) and torch Adam's state (both moments, the step). A main parameter's `.grad`,
  the fp32 gradient the last step read, is dropped rather than moved: the next update's zero_grad drops it anyway.
  Back with `optimizer=True`.

Moving goes through HostStash (verlx/workers/host_stash.py): the Python objects megatron holds (parameters, bucket
views, main_grad views, optimizer state) never change. Loads are synchronous: `overlap` is accepted and ignored (a
megatron chunk's parameters are one buffer, which its first layer needs entire). On a CPU-only run `for_config`
ignores the settings with one warning per process; the class itself works on any device (the CPU tests use it).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

from verlx.workers.host_stash import HostStash

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def grad_buffers(chunks: list) -> list[torch.Tensor]:
    """The contiguous gradient buffers of megatron DDP-wrapped chunks (none for unwrapped ones)."""
    from megatron.core.distributed import DistributedDataParallel

    return [buffer.grad_data for chunk in chunks if isinstance(chunk, DistributedDataParallel)
            for buffer in [*chunk.buffers, *chunk.expert_parallel_buffers]]


def _optimizer_parts(optimizer) -> list:
    return list(getattr(optimizer, "chained_optimizers", [optimizer]))


def main_params_and_state(optimizer) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """The inner (torch) optimizers' parameters (megatron's main params) and their state tensors."""
    params, state = [], []
    for part in _optimizer_parts(optimizer):
        inner = part.optimizer
        params += [p for group in inner.param_groups for p in group["params"]]
        state += [v for values in inner.state.values() for v in values.values() if torch.is_tensor(v)]
    return params, state


class MegatronOffloader:
    """Keeps what the flags name in host memory between phases; `with offloader.on_device(optimizer=...):` brings
    it to the device for one phase (see the module docstring for what each flag moves)."""

    def __init__(self, role: str, chunks: list, optimizer, device: torch.device, param_offload: bool,
                 grad_offload: bool = False, optimizer_offload: bool = False):
        self.role, self.chunks, self.optimizer, self.device = role, chunks, optimizer, device
        self.param_offload = param_offload
        self.grad_offload = grad_offload and bool(grad_buffers(chunks))
        self.optimizer_offload = optimizer_offload and optimizer is not None
        pin = device.type == "cuda"
        self.param_stash = HostStash(device, pin)
        self.optimizer_stash = HostStash(device, pin)
        self._model_storages = {p.untyped_storage()._cdata for p in self._params()}
        self._grad_bytes: list[tuple[torch.UntypedStorage, int]] = []
        self.params_on_device = self.grads_on_device = self.optimizer_on_device = True
        self.bytes_moved = 0  # by the last offload of params and optimizer state (grads are freed, not moved)

    @classmethod
    def for_config(cls, role: str, chunks: list, optimizer, device: torch.device, megatron_cfg) -> MegatronOffloader:
        """The engine's offloader from the role's megatron section; on a CPU-only run the flags are ignored, with
        one warning per process."""
        flags = (megatron_cfg.param_offload, megatron_cfg.grad_offload, megatron_cfg.optimizer_offload)
        if any(flags) and device.type != "cuda":
            if "cpu" not in _warned:
                _warned.add("cpu")
                logger.warning("%s: megatron.param_offload / grad_offload / optimizer_offload are ignored on a "
                               "CPU-only run (the model already lives in host memory)", role)
            flags = (False, False, False)
        return cls(role, chunks, optimizer, device, *flags)

    def _params(self) -> list[torch.Tensor]:
        return [p for chunk in self.chunks for p in chunk.parameters()]

    def _optimizer_tensors(self) -> list[torch.Tensor]:
        """Main params that are not model parameters (fp32 copies of bf16 weights), and the Adam state."""
        params, state = main_params_and_state(self.optimizer)
        own = [p for p in params if p.untyped_storage()._cdata not in self._model_storages]
        return own + state

    # ------------------------------------------------------------------ moving
    def offload(self) -> None:
        """Move (params, optimizer state) or free (grads) what the flags name, and release the device memory."""
        moved = 0
        if self.param_offload and self.params_on_device:
            moved += self.param_stash.stash(self._params())
            self.params_on_device = False
        if self.grad_offload and self.grads_on_device:
            storages = {g.untyped_storage()._cdata: g.untyped_storage() for g in grad_buffers(self.chunks)}
            self._grad_bytes = [(s, s.nbytes()) for s in storages.values()]
            for storage, _ in self._grad_bytes:
                storage.resize_(0)
            self.grads_on_device = False
        if self.optimizer_offload and self.optimizer_on_device:
            for param in main_params_and_state(self.optimizer)[0]:
                param.grad = None
            moved += self.optimizer_stash.stash(self._optimizer_tensors())
            self.optimizer_on_device = False
        self.bytes_moved = moved or self.bytes_moved
        if self.device.type == "cuda" and (self.param_offload or self.grad_offload or self.optimizer_offload):
            torch.cuda.empty_cache()

    def load(self, optimizer: bool = False) -> None:
        """Parameters back; with `optimizer`, the gradient buffers (zero-filled) and the optimizer state too."""
        if self.param_offload and not self.params_on_device:
            self.param_stash.restore()
            self.params_on_device = True
        if optimizer and self.grad_offload and not self.grads_on_device:
            for storage, nbytes in self._grad_bytes:
                storage.resize_(nbytes)
            for grad in grad_buffers(self.chunks):
                grad.zero_()
            self._grad_bytes = []
            self.grads_on_device = True
        if optimizer and self.optimizer_offload and not self.optimizer_on_device:
            self.optimizer_stash.restore()
            self.optimizer_on_device = True

    @contextmanager
    def on_device(self, optimizer: bool = False, overlap: bool = False):
        """What the phase uses on the device for the block (`overlap` is ignored: loads are synchronous);
        offloaded again after it."""
        self.load(optimizer)
        try:
            yield
        finally:
            self.offload()
