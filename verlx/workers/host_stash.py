"""Device storages moved to reused host buffers and back, into the same Python objects: the mechanism under the
fsdp and megatron engines' offload (param_offload, optimizer_offload, ...).

What moves is a storage: its bytes are copied into a host buffer and the device memory is freed by resizing the
storage to zero bytes; a restore gives the storage its bytes back and copies them in. Every tensor viewing the
storage (parameters, buffer views, optimizer state) stays valid without re-registration. Works on any device (the
CPU tests move CPU storages); host buffers are pinned where `pin` asks and CUDA allows.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

logger = logging.getLogger(__name__)
_warned: set[str] = set()


def _byte_view(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if hasattr(t, "_local_tensor") else t  # a DTensor's shard


class HostStash:
    """Device storages moved to host buffers and back. A buffer belongs to one storage: allocated (pinned when
    `pin`) on its first move and reused by every later move of the same storage."""

    def __init__(self, device: torch.device, pin: bool):
        self.device, self.pin = device, pin
        self.allocations = 0  # host buffers allocated so far: stays put once every storage has one
        self._buffers: dict[int, torch.Tensor] = {}
        self._moved: list[tuple[torch.UntypedStorage, torch.Tensor]] = []

    def _buffer(self, nbytes: int) -> torch.Tensor:
        self.allocations += 1
        if self.pin:
            try:
                return torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
            except RuntimeError as e:
                if "pin" not in _warned:
                    _warned.add("pin")
                    logger.warning("offload: pinned host memory unavailable (%s); using pageable buffers, which "
                                   "copy several times slower", e)
                self.pin = False
        return torch.empty(nbytes, dtype=torch.uint8)

    def stash(self, tensors: Iterable[torch.Tensor]) -> int:
        """Copy the storages of `tensors` that hold bytes on this device into their host buffers and free them;
        returns the bytes moved. Buffers of storages no longer among them are dropped."""
        storages: dict[int, torch.UntypedStorage] = {}
        for t in tensors:
            storage = local_tensor(t).untyped_storage()
            if storage.device.type == self.device.type and storage.nbytes() > 0:
                storages.setdefault(storage._cdata, storage)
        buffers = {}
        for key, storage in storages.items():
            buffer = self._buffers.get(key)
            if buffer is None or buffer.numel() != storage.nbytes():
                buffer = self._buffer(storage.nbytes())
            buffer.copy_(_byte_view(storage), non_blocking=self.pin)
            buffers[key] = buffer
        for storage in storages.values():  # the frees follow the copies on the same stream
            storage.resize_(0)
        self._buffers = buffers
        self._moved = [(storage, buffers[key]) for key, storage in storages.items()]
        return sum(b.numel() for b in buffers.values())

    def restore(self, stream: torch.cuda.Stream | None = None) -> torch.cuda.Event | None:
        """Give the moved storages their bytes back (allocated on the current stream, which uses them) and copy the
        host buffers in: on `stream` when given, returning the event that marks the end of the copies."""
        moved, self._moved = self._moved, []
        for storage, buffer in moved:
            storage.resize_(buffer.numel())
        if stream is None:
            for storage, buffer in moved:
                _byte_view(storage).copy_(buffer, non_blocking=self.pin)
            return None
        stream.wait_stream(torch.cuda.current_stream(stream.device))  # the allocations, and the last copies out
        with torch.cuda.stream(stream):
            for storage, buffer in moved:
                _byte_view(storage).copy_(buffer, non_blocking=self.pin)
            return stream.record_event()
