"""Weights from the trainer's workers into a rollout worker group of its own (actor_rollout_ref.hybrid_engine=false).

The two worker groups are separate torch.distributed worlds, so the transfer has a process group of its own: built
from a TCPStore that the trainer's rank 0 hosts, over the trainer's rank 0 (group rank 0) and every rollout rank
(1..R); gloo on CPU, NCCL on GPU. Every trainer rank iterates `rollout_weights` (a collective that gathers the
sharded parameters); rank 0 packs the full tensors into buckets of rollout.update_weights_bucket_megabytes and
broadcasts them. Each rollout rank turns the buckets back into named tensors and feeds them to its engine as ONE
`update_weights` call per policy version, so the engine sees a complete push.

One bucket on the wire: a header (more?, version, metadata bytes, elements), the metadata (pickled names, shapes
and dtype) and the flat tensor; a header with more=0 ends the version.
"""

from __future__ import annotations

import datetime
import pickle
from collections.abc import Iterable, Iterator

import torch
import torch.distributed as dist

_PREFIX = "verlx_weight_transfer"


def open_store(timeout_s: float) -> dist.TCPStore:
    """The rendezvous of the transfer group, hosted here (the trainer's rank 0) on a free port."""
    return dist.TCPStore("0.0.0.0", 0, None, is_master=True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def join_group(store: dist.Store | None, host: str, port: int, rank: int, world: int, device: torch.device,
               timeout_s: float):
    """This process's member of the transfer group (blocks until all `world` members have joined)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, None, is_master=False, timeout=timeout)
    prefixed = dist.PrefixStore(_PREFIX, store)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world, options)
    return dist.ProcessGroupGloo(prefixed, rank, world, timeout)


def _broadcast(group, tensor: torch.Tensor) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    group.broadcast([tensor], options).wait()


def send(group, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int, bucket_bytes: int,
         device: torch.device) -> dict[str, float]:
    """Broadcast every tensor (group rank 0); returns the bytes and buckets sent."""
    bucket: list[tuple[str, torch.Tensor]] = []
    size = sent = buckets = 0
    for name, tensor in named_tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if bucket and (size + nbytes > bucket_bytes or tensor.dtype != bucket[0][1].dtype):
            _send_bucket(group, bucket, version, device)
            buckets += 1
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += nbytes
        sent += nbytes
    if bucket:
        _send_bucket(group, bucket, version, device)
        buckets += 1
    _broadcast(group, torch.tensor([0, version, 0, 0], dtype=torch.int64, device=device))
    return {"bytes": float(sent), "buckets": float(buckets)}


def _send_bucket(group, bucket: list[tuple[str, torch.Tensor]], version: int, device: torch.device) -> None:
    dtype = bucket[0][1].dtype
    meta = pickle.dumps(([(name, tuple(t.shape)) for name, t in bucket], str(dtype).removeprefix("torch.")))
    flat = torch.cat([t.detach().reshape(-1).to(device) for _, t in bucket])
    _broadcast(group, torch.tensor([1, version, len(meta), flat.numel()], dtype=torch.int64, device=device))
    _broadcast(group, torch.frombuffer(bytearray(meta), dtype=torch.uint8).to(device))
    _broadcast(group, flat)


def receive(group, version: int, device: torch.device) -> Iterator[tuple[str, torch.Tensor]]:
    """The named tensors of one version, bucket by bucket (group ranks 1..R). When the sender's version is not the
    one expected (the two sides disagree on what is being sent) nothing is yielded: the stream is drained, so the
    sender finishes, and then this raises."""
    while True:
        header = torch.zeros(4, dtype=torch.int64, device=device)
        _broadcast(group, header)
        more, sent_version, meta_len, numel = header.tolist()
        if not more:
            if sent_version != version:
                raise RuntimeError(f"weight transfer: expected policy version {version}, the trainer sent "
                                   f"{sent_version}; nothing was loaded")
            return
        meta = torch.empty(meta_len, dtype=torch.uint8, device=device)
        _broadcast(group, meta)
        entries, dtype_name = pickle.loads(meta.cpu().numpy().tobytes())
        flat = torch.empty(numel, dtype=getattr(torch, dtype_name), device=device)
        _broadcast(group, flat)
        if sent_version != version:
            continue
        offset = 0
        for name, shape in entries:
            n = 1
            for d in shape:
                n *= d
            yield name, flat[offset:offset + n].view(shape)
            offset += n
