"""Offload by storage: an FSDP2 model's shards and its AdamW state leave the device and come back bit for bit, into
the same Python objects, through host buffers allocated once and reused (CPU, a 1-rank gloo group: the device is
the CPU itself, buffers are pageable there; the stream overlap needs CUDA and is measured by
benchmarks/offload_memory.py)."""

from __future__ import annotations

import gc
import logging

import pytest
import torch
import torch.distributed as dist

from helpers.ppo_batches import ragged_ppo_batch
from verlx.utils.distributed import free_port
from verlx.workers.fsdp import offload
from verlx.workers.fsdp.offload import Offloader, fsdp_units, optimizer_state_tensors
from verlx.workers.host_stash import local_tensor

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def gloo():
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    yield
    gc.collect()
    dist.destroy_process_group()


def _policy():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verlx.models.policy import PolicyModel
    from verlx.workers.fsdp.model_builder import apply_fsdp2

    cfg = Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    return apply_fsdp2(PolicyModel(Qwen2ForCausalLM(cfg).float(), packed=True), CPU, torch.float32)


def _actor(module, with_offloader: bool):
    from verlx.config.roles import ActorConfig
    from verlx.workers.actor import PPOActor
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import build_optimizer

    cfg = ActorConfig(ppo_mini_batch_size=4, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=40)
    cfg.optim.lr = 1e-2
    optimizer = build_optimizer(module.parameters(), cfg.optim)
    offloader = Offloader("actor", module, optimizer, CPU, param_offload=True, optimizer_offload=True) \
        if with_offloader else None
    return PPOActor(cfg, FSDPEngine("actor", module, optimizer, CPU, offloader=offloader))


def _snapshot(module, optimizer) -> dict[str, torch.Tensor]:
    out = {f"param:{n}": p.full_tensor().clone() for n, p in module.named_parameters()}
    for i, t in enumerate(optimizer_state_tensors(optimizer)):
        out[f"state:{i}"] = t.full_tensor().clone() if hasattr(t, "full_tensor") else t.clone()
    return out


def _storage_bytes(module, optimizer) -> int:
    tensors = [*module.parameters(), *optimizer_state_tensors(optimizer)]
    return sum(local_tensor(t).untyped_storage().nbytes() for t in tensors)


def test_units_in_forward_order_each_parameter_once(gloo):
    module = _policy()
    units = fsdp_units(module)
    layers = list(module.hf_model.model.layers)
    assert [u for u, _ in units] == [module, *layers]
    root_names = {n for n, p in module.named_parameters() if any(p is q for q in units[0][1])}
    assert root_names == {"hf_model.model.embed_tokens.weight", "hf_model.model.norm.weight"}  # lm_head is tied
    assert sum(len(params) for _, params in units) == len(list(module.parameters()))


def test_training_with_offload_round_trips_is_bit_identical_and_reuses_its_buffers(gloo):
    plain, offloaded = _actor(_policy(), False), _actor(_policy(), True)  # seeded: the same weights
    engine = offloaded.engine
    engine.offload()  # as the workers do after building
    param_objects = [id(p) for p in engine.module.parameters()]
    buffers_after = []
    for step in range(3):
        data = ragged_ppo_batch(step, rows=8, token_range=(1, 61), meta_info={"temperature": 1.0})
        want = plain.update_policy(data, 8, None)
        with engine.on_device(optimizer=True, overlap=True):
            got = offloaded.update_policy(data, 8, None)
        assert got == want, step
        # everything left the device: every parameter and Adam storage holds 0 bytes until the next phase
        assert _storage_bytes(engine.module, engine.optimizer) == 0
        stashes = [*engine.offloader.param_stashes, engine.offloader.optimizer_stash]
        buffers_after.append((engine.offloader.host_allocations(),
                              sorted(b.data_ptr() for s in stashes for b in s._buffers.values())))
        with engine.on_device(optimizer=True):
            a, b = _snapshot(plain.engine.module, plain.engine.optimizer), _snapshot(engine.module, engine.optimizer)
        assert a.keys() == b.keys() and len([k for k in a if k.startswith("state:")]) > 0
        for key in a:
            assert torch.equal(a[key], b[key]), (step, key)
    assert [id(p) for p in engine.module.parameters()] == param_objects  # the same Parameter objects throughout
    # one buffer per parameter storage (4 units' worth) and per Adam tensor, allocated in the first round trips only
    allocations = [n for n, _ in buffers_after]
    assert allocations[0] == allocations[1] == allocations[2]
    assert buffers_after[0][1] == buffers_after[2][1]  # the same host memory, step after step
    params = list(engine.module.parameters())
    # fp32 weights, Adam's m and v (3 × 4 B per parameter), and AdamW's fp32 step scalar per tensor (on this device)
    assert engine.offloader.bytes_moved == 12 * sum(p.numel() for p in params) + 4 * len(params)


def test_replaced_optimizer_state_gets_a_new_buffer_and_the_old_one_is_dropped(gloo):
    actor = _actor(_policy(), True)
    engine = actor.engine
    data = ragged_ppo_batch(0, rows=8, token_range=(1, 61), meta_info={"temperature": 1.0})
    with engine.on_device(optimizer=True):
        actor.update_policy(data, 8, None)
    before = engine.offloader.host_allocations()
    with engine.on_device(optimizer=True):  # a checkpoint load puts new tensors into the state dict
        state = next(iter(engine.optimizer.state.values()))
        state["exp_avg"] = state["exp_avg"].clone() + 1
        expected = state["exp_avg"].full_tensor().clone()
    assert engine.offloader.host_allocations() == before + 1
    assert len(engine.offloader.optimizer_stash._buffers) == len(optimizer_state_tensors(engine.optimizer))
    with engine.on_device(optimizer=True):
        assert torch.equal(state["exp_avg"].full_tensor(), expected)


def test_cpu_runs_ignore_the_offload_settings_with_one_warning(gloo, caplog, monkeypatch):
    monkeypatch.setattr(offload, "_warned", set())
    module = _policy()
    with caplog.at_level(logging.WARNING):
        first = Offloader.for_config("actor", module, None, CPU, param_offload=True)
        Offloader.for_config("ref", module, None, CPU, param_offload=True)
    assert not first.param_offload and first.units == []
    assert len([r for r in caplog.records if "ignored on a CPU-only run" in r.getMessage()]) == 1
