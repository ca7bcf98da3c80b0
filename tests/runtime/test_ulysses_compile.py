"""Compiled decoder layers with Ulysses SP=2 on 2 gloo processes: the attention (with its all-to-alls) stays
outside the graphs, and log-probs and summed gradients equal the unsplit eager model's in fp32."""

from __future__ import annotations

import copy
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verlx.utils.distributed import free_port


def _worker(rank: int, world: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from transformers import AutoModelForCausalLM

        from helpers.compile_models import assert_fp32_close, packed_batch, tiny_config
        from verlx.models.compile import compile_failure, compile_model
        from verlx.models.policy import PolicyModel

        group = dist.new_group(list(range(world)))
        torch.manual_seed(0)
        hf = AutoModelForCausalLM.from_config(tiny_config()).float()
        unsplit = PolicyModel(copy.deepcopy(hf), packed=True)
        split = PolicyModel(copy.deepcopy(hf), packed=True, sp_group=group)
        compile_model(split)
        for seed, rows in ((1, 3), (2, 5)):  # two packed lengths, one compilation
            ids, mask, pos, resp = packed_batch(seed, rows)
            results = []
            for model in (unsplit, split):
                model.zero_grad(set_to_none=True)
                lp, _ = model(ids, mask, pos, resp, chunk_size=4)
                lp[mask[:, -resp:].bool()].sum().backward()
                grads = {n: p.grad.clone() for n, p in model.named_parameters()}
                if model is split:
                    for g in grads.values():
                        dist.all_reduce(g, group=group)
                results.append((lp.detach(), grads))
            assert_fp32_close(results[0][0], results[1][0], "log-probs")
            for name, want in results[0][1].items():
                assert_fp32_close(want, results[1][1][name], name)
        assert compile_failure() is None
    finally:
        dist.destroy_process_group()


def test_compiled_sp2_matches_eager_sp1():
    mp.start_processes(_worker, args=(2, free_port()), nprocs=2, join=True, start_method="spawn")
