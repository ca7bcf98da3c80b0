"""Offload on a GPU: pinned host buffers, copies back on a side stream that compute overlaps (each FSDP unit waits
for its own shards, the optimizer step for its state). Training through offload round trips equals training
resident, bit for bit (the same kernels on the same values), the device really is emptied between phases, and the
pinned buffers are allocated once."""

from __future__ import annotations

import gc
import socket

import pytest
import torch
import torch.distributed as dist

from helpers.ppo_batches import ragged_ppo_batch
from verlx.workers.fsdp.offload import Offloader, optimizer_state_tensors

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda", 0)


@pytest.fixture(scope="module")
def one_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    gc.collect()
    dist.destroy_process_group()


def _actor(offload: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verlx.config.roles import ActorConfig
    from verlx.models.policy import PolicyModel
    from verlx.workers.actor import PPOActor
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import apply_fsdp2, build_optimizer

    cfg = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    module = apply_fsdp2(PolicyModel(Qwen2ForCausalLM(cfg).float(), packed=True), CUDA, torch.bfloat16)
    actor_cfg = ActorConfig(ppo_mini_batch_size=4, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=64)
    optimizer = build_optimizer(module.parameters(), actor_cfg.optim)
    offloader = Offloader("actor", module, optimizer, CUDA, param_offload=offload, optimizer_offload=offload)
    return PPOActor(actor_cfg, FSDPEngine("actor", module, optimizer, CUDA, offloader=offloader))


def test_offloaded_training_equals_resident_and_empties_the_device(one_rank):
    resident, offloaded = _actor(False), _actor(True)
    engine = offloaded.engine
    engine.offload()
    allocations = []
    for step in range(3):
        data = ragged_ppo_batch(step, rows=8, token_range=(1, 512), meta_info={"temperature": 1.0})
        with resident.engine.on_device(optimizer=True, overlap=True):
            want = resident.update_policy(data, 8, None)
        before = torch.cuda.memory_allocated(CUDA)
        with engine.on_device(optimizer=True, overlap=True):
            got = offloaded.update_policy(data, 8, None)
        assert got == want, step
        freed = sum(t.untyped_storage().nbytes() for t in optimizer_state_tensors(engine.optimizer))
        assert freed == 0 and torch.cuda.memory_allocated(CUDA) <= before
        allocations.append(engine.offloader.host_allocations())
        assert all(b.is_pinned() for s in engine.offloader.param_stashes for b in s._buffers.values())
    assert allocations[1] == allocations[2]
    with engine.on_device(optimizer=True):
        for a, b in zip(resident.engine.module.parameters(), engine.module.parameters()):
            assert torch.equal(a.full_tensor(), b.full_tensor())
