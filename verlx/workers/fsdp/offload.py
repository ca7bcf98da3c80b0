"""param_offload / optimizer_offload: an FSDP2 model's sharded parameters and optimizer state live on the CPU
between phases and come back to the GPU for the phase that computes with them.

Only this rank's shards move (1/N of the model each). Parameters move with `module.to()`, which FSDP2 supports on
sharded modules (it reshards first and re-registers the sharded parameters after the move, keeping the optimizer's
parameter objects). Optimizer state moves tensor by tensor; tensors that were on the CPU to begin with (AdamW's
`step` when not fused) stay there. After an offload the caching allocator returns its free blocks to the driver
(empty_cache), so that a rollout engine sizing its KV cache from free memory sees them.

On a CPU-only run there is nothing to offload: the settings are ignored, with one warning per process. Either
way a phase ends with only shards on the device: the root's parameters, which FSDP keeps gathered after a
forward-only pass, are resharded.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager

import torch

logger = logging.getLogger(__name__)
_warned: set[str] = set()


class Offloader:
    """Keeps `module`'s parameters (param_offload) and `optimizer`'s state (optimizer_offload) on the CPU between
    phases; `with offloader.on_device(optimizer=...):` brings them to `device` for one phase."""

    def __init__(self, role: str, module: torch.nn.Module, optimizer, device: torch.device, param_offload: bool,
                 optimizer_offload: bool = False):
        if (param_offload or optimizer_offload) and device.type != "cuda":
            if "cpu" not in _warned:
                _warned.add("cpu")
                logger.warning("%s: fsdp_config.param_offload / optimizer_offload are ignored on a CPU-only run "
                               "(the model already lives in host memory)", role)
            param_offload = optimizer_offload = False
        self.role, self.module, self.optimizer, self.device = role, module, optimizer, device
        self.param_offload = param_offload
        self.optimizer_offload = optimizer_offload and optimizer is not None
        self.params_on_device = True
        self.optimizer_on_device = True
        self._moved_state: list[tuple[torch.Tensor, str]] = []  # (param, state key) pairs offloaded

    def offload(self) -> None:
        """Move what is configured to the CPU and release the freed device memory. Without param_offload, only
        the root's gathered parameters are freed (a forward-only pass leaves them gathered, see apply_fsdp2)."""
        if not self.param_offload:
            reshard = getattr(self.module, "reshard", None)
            if reshard is not None:
                reshard()
        if not (self.param_offload or self.optimizer_offload):
            return
        if self.param_offload and self.params_on_device:
            self.module.to("cpu")
            self.params_on_device = False
        if self.optimizer_offload and self.optimizer_on_device:
            self._moved_state = []
            for param, state in self.optimizer.state.items():
                for key, value in state.items():
                    if torch.is_tensor(value) and value.device.type == self.device.type:
                        state[key] = value.to("cpu")
                        self._moved_state.append((param, key))
            self.optimizer_on_device = False
        torch.cuda.empty_cache()

    def load(self, optimizer: bool = False) -> None:
        """Bring the parameters (and, with `optimizer`, the optimizer state) back to the device."""
        if self.param_offload and not self.params_on_device:
            self.module.to(self.device)
            self.params_on_device = True
        if optimizer and self.optimizer_offload and not self.optimizer_on_device:
            for param, key in self._moved_state:
                state = self.optimizer.state[param]
                state[key] = state[key].to(self.device, non_blocking=True)
            self._moved_state = []
            self.optimizer_on_device = True

    @contextmanager
    def on_device(self, optimizer: bool = False):
        """Parameters (and optimizer state) on the device for the block; offloaded again after it."""
        self.load(optimizer)
        try:
            yield
        finally:
            self.offload()
