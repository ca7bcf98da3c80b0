"""FSDP2 training details on 2 gloo processes: deferring the gradient reduce-scatter to the last micro-batch gives
the synced update, gradients are reduced in the configured dtype (fsdp_config.reduce_dtype), the root stays gathered
after a forward-only pass until the phase ends, and the per-phase MFU is the mean over ranks of FLOPs / (seconds ×
peak)."""

from __future__ import annotations

import copy
import gc
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verlx.utils.distributed import free_port

PEAK = 2.0  # VERLX_PEAK_TFLOPS in the worker processes


def _policy():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verlx.models.policy import PolicyModel

    cfg = Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    torch.manual_seed(0)
    return PolicyModel(Qwen2ForCausalLM(cfg).float(), packed=True)


def _rank_batch(rank: int):
    """8 rows per rank with rank-specific lengths; the actor's data layout."""
    from helpers.ppo_batches import ragged_ppo_batch

    return ragged_ppo_batch(100 + rank, token_range=(1, 61), meta_info={"temperature": 1.0})


def _deferred_reduce_case(rank: int) -> None:
    from verlx.config.roles import ActorConfig
    from verlx.workers.actor import PPOActor
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import apply_fsdp2, build_optimizer
    from verlx.workers.micro_batching import gradient_accumulation, micro_batches

    base = _policy()
    data = _rank_batch(rank)
    results = {}
    for defer in (False, True):
        cfg = ActorConfig(ppo_mini_batch_size=8, use_dynamic_bsz=True, ppo_max_token_len_per_gpu=24)
        cfg.fsdp_config.defer_grad_reduce = defer
        cfg.optim.lr = 1e-2
        module = apply_fsdp2(copy.deepcopy(base), torch.device("cpu"), torch.float32)
        actor = PPOActor(cfg, FSDPEngine("actor", module, build_optimizer(module.parameters(), cfg.optim),
                                         defer_grad_reduce=defer))
        metrics = actor.update_policy(data, 8, None)
        assert all(p.grad is None for p in module.parameters())  # freed after the update
        results[defer] = (metrics, {n: p.full_tensor() for n, p in module.named_parameters()})
        parts, _ = micro_batches(data, None, True, 24)
        assert len(parts) >= 3  # several micro-batches per rank, so deferral matters
    (m0, p0), (m1, p1) = results[False], results[True]
    assert m0["actor/pg_loss"] == pytest.approx(m1["actor/pg_loss"], rel=1e-6)
    assert m0["actor/grad_norm"] == pytest.approx(m1["actor/grad_norm"], rel=1e-5)
    for name in p0:
        torch.testing.assert_close(p1[name], p0[name], rtol=0, atol=1e-6, msg=name)
    assert any(not torch.equal(p0[n], base.state_dict()[n]) for n in p0)  # the step moved the weights

    # the observable difference: no sharded gradient exists until the last micro-batch's backward
    module = apply_fsdp2(copy.deepcopy(base), torch.device("cpu"), torch.float32)
    parts, _ = micro_batches(data, None, True, 24)
    seen = []
    for mb in gradient_accumulation(module, parts, defer_reduce=True):
        lp, _ = module(mb.batch["input_ids"], mb.batch["attention_mask"], mb.batch["position_ids"], 5)
        lp.sum().backward()
        seen.append(all(p.grad is not None for p in module.parameters()))
    assert seen == [False] * (len(parts) - 1) + [True]


def _reduce_dtype_case(rank: int) -> None:
    """With reduce_dtype=bf16 the averaged gradient comes out of a bf16 reduce-scatter: every value is a bf16 number
    (halving is exact), which an fp32 reduction of the same gradients is not; the two agree to bf16's precision of
    the gradient's scale (the ranks' rounding errors survive a cancelling sum)."""
    from verlx.workers.fsdp.model_builder import apply_fsdp2

    base, data = _policy(), _rank_batch(rank)
    grads = {}
    for reduce_dtype in (torch.float32, torch.bfloat16):
        module = apply_fsdp2(copy.deepcopy(base), torch.device("cpu"), torch.float32, reduce_dtype=reduce_dtype,
                             mixed_precision_on_cpu=True)
        lp, _ = module(data.batch["input_ids"], data.batch["attention_mask"], data.batch["position_ids"], 5)
        lp.sum().backward()
        grads[reduce_dtype] = {n: p.grad.full_tensor() for n, p in module.named_parameters()}
    for name, g16 in grads[torch.bfloat16].items():
        g32 = grads[torch.float32][name]
        assert g16.dtype == torch.float32 and torch.equal(g16, g16.bfloat16().float()), name
        # each rank's gradient is rounded to bf16 before the sum: an error of its own magnitude's bf16 step
        torch.testing.assert_close(g16, g32, rtol=0, atol=2**-7 * g32.abs().max().item() + 1e-12, msg=name)
    assert any(not torch.equal(g, g.bfloat16().float()) for g in grads[torch.float32].values())


def _root_reshard_case() -> None:
    from torch.distributed.tensor import DTensor

    from verlx.workers.fsdp.model_builder import apply_fsdp2
    from verlx.workers.fsdp.offload import Offloader

    module = apply_fsdp2(_policy(), torch.device("cpu"), torch.float32)
    data = _rank_batch(0)
    embed = module.hf_model.get_input_embeddings()
    layer = module.hf_model.model.layers[0].mlp.up_proj
    offloader = Offloader("actor", module, None, torch.device("cpu"), param_offload=False)
    with offloader.on_device(), torch.no_grad():
        module(data.batch["input_ids"], data.batch["attention_mask"], data.batch["position_ids"], 5)
        # layers resharded after their forward; the root (embeddings, lm_head) kept gathered
        assert isinstance(layer.weight, DTensor) and not isinstance(embed.weight, DTensor)
    assert isinstance(embed.weight, DTensor)  # the phase's end reshards the root


def _phase_metrics_case(rank: int) -> None:
    from transformers import Qwen2Config

    from verlx.metrics.phases import phase_metrics
    from verlx.utils.flops import dense_decoder_flops
    from verlx.workers.perf import PhaseTimer

    cfg = Qwen2Config(hidden_size=8, num_attention_heads=2, num_key_value_heads=1, intermediate_size=16,
                      num_hidden_layers=2, vocab_size=10)
    # test_flops: FLOPs of [3, 5] = 62976 + 3264 = 66240; of [4]: 6·1312·4 + 96·16 = 31488 + 1536 = 33024
    seq_lens, seconds = ([3, 5], 2.0) if rank == 0 else ([4], 1.0)
    assert dense_decoder_flops(cfg, [3, 5]) == 66240 and dense_decoder_flops(cfg, [4]) == 33024
    timer = PhaseTimer(torch.device("cpu"))
    timer.seconds = seconds
    out = phase_metrics("actor", cfg, seq_lens, timer)
    # rank 0: 66240 / 2 s / 1e12 / 2 TFLOP/s; rank 1: 33024 / 1 s / 1e12 / 2; the mean of the two
    want = (66240 / 2.0 + 33024 / 1.0) / 1e12 / PEAK / 2
    assert out == {"perf/mfu/actor": pytest.approx(want, rel=1e-12)}  # no memory key on CPU
    out = phase_metrics("actor_infer", cfg, seq_lens, timer, forward_only=True, share=0.5)
    assert out == {"perf/mfu/actor_infer": pytest.approx(want / 3 / 2, rel=1e-12)}


def _worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), VERLX_PEAK_TFLOPS=str(PEAK))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        _deferred_reduce_case(rank)
        _reduce_dtype_case(rank)
        _root_reshard_case()
        _phase_metrics_case(rank)
    finally:
        # FSDP modules sit in reference cycles that hold the process group; collected only at interpreter exit,
        # after destroy_process_group, gloo's threads abort the process ("terminate called without an active
        # exception", SIGABRT) in about half the runs
        gc.collect()
        dist.destroy_process_group()


def test_fsdp_training_on_two_gloo_processes():
    mp.start_processes(_worker, args=(2, free_port()), nprocs=2, join=True, start_method="spawn")
