"""The trainer → rollout-group weight broadcast (workers/weight_transfer.py) between real Ray actors over gloo: a
group of its own beside each actor's world, buckets of the configured size, every tensor arriving intact."""

from __future__ import annotations

import pytest
import ray
import torch


@ray.remote(num_cpus=1)
class Member:
    """One process of the transfer group: rank 0 hosts the store and sends, the others receive."""

    def __init__(self):
        self.store = self.group = None

    def host(self) -> int:
        from verlx.workers.weight_transfer import open_store

        self.store = open_store(60)
        return self.store.port

    def join(self, port: int, rank: int, world: int) -> None:
        from verlx.workers.weight_transfer import join_group

        self.group = join_group(self.store, "127.0.0.1", port, rank, world, torch.device("cpu"), 60)

    def send(self, tensors: dict, version: int, bucket_bytes: int) -> dict:
        from verlx.workers.weight_transfer import send

        return send(self.group, iter(tensors.items()), version, bucket_bytes, torch.device("cpu"))

    def receive(self, version: int) -> list:
        from verlx.workers.weight_transfer import receive

        return [(name, tensor.clone()) for name, tensor in receive(self.group, version, torch.device("cpu"))]


@pytest.fixture(scope="module")
def group(ray_cpu):
    members = [Member.remote() for _ in range(3)]
    port = ray.get(members[0].host.remote())
    ray.get([m.join.remote(port, rank, 3) for rank, m in enumerate(members)])
    return members


def test_every_tensor_arrives_intact_in_buckets(group):
    torch.manual_seed(0)
    tensors = {"embed": torch.randn(10, 4), "layer.0.w": torch.randn(4, 4), "layer.0.b": torch.randn(4),
               "norm": torch.randn(4, dtype=torch.float64), "head": torch.randn(3, 4)}
    sender, *receivers = group
    # 100-byte buckets: [embed (160 B, alone)], [w 64 B + b 16 B], [norm: another dtype], [head]
    sent = sender.send.remote(tensors, 7, bucket_bytes=100)
    got = ray.get([r.receive.remote(7) for r in receivers])
    stats = ray.get(sent)
    assert stats == {"bytes": float(sum(t.numel() * t.element_size() for t in tensors.values())), "buckets": 4.0}
    for received in got:
        assert [name for name, _ in received] == list(tensors)
        for name, tensor in received:
            assert tensor.dtype == tensors[name].dtype and torch.equal(tensor, tensors[name]), name


def test_a_receiver_expecting_another_version_fails_loudly(group):
    sender, *receivers = group
    sent = sender.send.remote({"w": torch.ones(2)}, 3, bucket_bytes=1 << 20)
    received = [r.receive.remote(4) for r in receivers]
    ray.get(sent, timeout=30)  # the receivers drain the stream, so the sender is not left waiting
    for ref in received:
        with pytest.raises(ray.exceptions.RayTaskError, match="expected policy version 4, the trainer sent 3"):
            ray.get(ref, timeout=30)
