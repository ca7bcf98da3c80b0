"""Running megatron-core's training path (DDP, optimizer, pipeline schedule) on the CPU, for tests.

megatron-core computes on whatever device the model is on, but allocates a few bookkeeping tensors on CUDA by name
(`device="cuda"`, `torch.cuda.current_device()`: the schedule's token counter, the optimizer's loss scale, DDP's
gradient buffers) or moves them with `.cuda()` (the pipeline's tied embedding copy before its all-reduce).
The MoE all-to-all dispatcher copies its split sizes on a CUDA side stream (here the one CPU stream).
Sequence parallelism forks megatron's CUDA RNG stream around dropout; with dropout 0 nothing is drawn from it, so
the fork is a no-op here. megatron's mixed-precision and distributed optimizers and its gradient clipping accept
parameters by their `tensor.type()` name ('torch.cuda.BFloat16Tensor', 'torch.cuda.FloatTensor'): CPU tensors report
the CUDA names inside the block, so bf16 models with fp32 main params, the distributed optimizer and clipping run as
on a GPU. `cuda_as_cpu()` keeps all of that on the CPU; everything else runs unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager, nullcontext

import pytest
import torch
from torch.overrides import TorchFunctionMode


def require_megatron_core() -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install 'verlx[megatron]'); "
                        "the megatron backend's CPU tests run where it is")


class _CudaAsCpu(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:  # the type's name, not a cast
            name = func(*args)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "cpu"}
        return func(*args, **kwargs)


def _as_host_array(tensor, as_numpy: bool = False, record_stream: bool = False):
    return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor


class _NoStream:
    """A CUDA stream on the CPU: work is already ordered, so waiting and events are no-ops."""

    def wait_stream(self, other) -> None:
        pass

    def record_event(self, event=None):
        return self

    def synchronize(self) -> None:
        pass


class _NoRNGStreams:
    """megatron's CUDA RNG tracker for models without dropout: forking a stream changes nothing."""

    def fork(self, name: str | None = None):
        return nullcontext()


@contextmanager
def cuda_as_cpu(monkeypatch):
    """Tensors megatron-core creates on "cuda" are created on the CPU inside the block."""
    from megatron.core import tensor_parallel

    monkeypatch.setattr(tensor_parallel, "get_cuda_rng_tracker", _NoRNGStreams)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # the pipeline's p2p shape exchange
    from megatron.core.transformer.moe import token_dispatcher

    # the MoE all-to-all dispatcher turns CUDA split sizes into numpy arrays (CPU tensors it leaves as they are,
    # which all_to_all refuses), on a side stream
    monkeypatch.setattr(token_dispatcher, "maybe_move_tensor_to_cpu", _as_host_array)
    current = _NoStream()
    monkeypatch.setattr(torch.cuda, "Stream", _NoStream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: current)
    monkeypatch.setattr(torch.cuda, "stream", lambda stream: nullcontext())
    with _CudaAsCpu():
        yield


@pytest.fixture
def megatron_on_cpu(one_rank, monkeypatch):
    """This process as a one-rank megatron world on the CPU; megatron's parallel state is torn down after."""
    require_megatron_core()
    from megatron.core import parallel_state as mpu

    with cuda_as_cpu(monkeypatch):
        yield
    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()


@contextmanager
def two_gloo_ranks_with_model(rank: int, tmp: str, save_model: Callable[[str], None]):
    """One of 2 gloo ranks (rendezvous through a file in `tmp`) with megatron on the CPU: yields the path of the HF
    model rank 0 wrote with `save_model(path)`; the process group is destroyed afterwards."""
    import os

    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=rank, world_size=2)
    path = os.path.join(tmp, "hf")
    if rank == 0:
        save_model(path)
    dist.barrier()
    with pytest.MonkeyPatch.context() as monkeypatch, cuda_as_cpu(monkeypatch):
        yield path
    dist.destroy_process_group()


def two_gloo_ranks_with_tiny_qwen2(rank: int, tmp: str):
    """`two_gloo_ranks_with_model` with a tiny Qwen2."""
    from helpers.tiny_tokenizer import save_tiny_qwen2

    return two_gloo_ranks_with_model(rank, tmp, save_tiny_qwen2)
