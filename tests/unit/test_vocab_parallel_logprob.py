"""Vocab-parallel log-probs over real gloo ranks against the full-vocabulary reference, values and gradients."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from verlx.models.chunked_logprob import full_logits_log_probs
from verlx.models.vocab_parallel_logprob import vocab_parallel_log_probs, vocab_parallel_sum_pi_squared

V, H, N, TP = 11, 6, 7, 2  # 11 rows → padded to 12: rank 1 holds one padding row


def _inputs():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64)
    weight = torch.randn(V, H, generator=g, dtype=torch.float64)
    targets = torch.randint(0, V, (N,), generator=g)
    targets[0], targets[1] = 0, V - 1  # first and last vocabulary rows, owned by different ranks
    return hidden, weight, targets


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=TP)
    hidden, weight, targets = _inputs()
    rows = -(-V // TP)
    padded = torch.cat([weight, torch.full((rows * TP - V, H), 7.0, dtype=weight.dtype)])  # junk padding rows
    shard = padded[rank * rows:(rank + 1) * rows].clone().requires_grad_(True)
    h = hidden.clone().requires_grad_(True)
    logp, ent = vocab_parallel_log_probs(h, shard, targets, rank * rows, V, temperature=0.7, chunk_size=3,
                                         with_entropy=True, group=dist.group.WORLD)
    (logp * torch.arange(1, N + 1) + 0.3 * ent).sum().backward()
    spsq = vocab_parallel_sum_pi_squared(hidden, shard.detach(), rank * rows, V, temperature=0.7, chunk_size=3,
                                         group=dist.group.WORLD)
    torch.save({"logp": logp.detach(), "ent": ent.detach(), "gh": h.grad, "gw": shard.grad, "spsq": spsq},
               os.path.join(out_dir, f"r{rank}.pt"))
    dist.destroy_process_group()


def test_matches_full_vocabulary_reference():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(os.path.join(tmp, "init"), tmp), nprocs=TP)
        parts = [torch.load(os.path.join(tmp, f"r{r}.pt")) for r in range(TP)]
    hidden, weight, targets = _inputs()
    h = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    ref_logp, ref_ent = full_logits_log_probs(h, w, targets, temperature=0.7, with_entropy=True)
    (ref_logp * torch.arange(1, N + 1) + 0.3 * ref_ent).sum().backward()
    ref_spsq = torch.softmax(hidden @ weight.t() / 0.7, dim=-1).square().sum(-1)  # the padding rows not included
    for p in parts:
        torch.testing.assert_close(p["spsq"], ref_spsq, rtol=0, atol=1e-12)
        torch.testing.assert_close(p["logp"], ref_logp.detach(), rtol=0, atol=1e-12)
        torch.testing.assert_close(p["ent"], ref_ent.detach(), rtol=0, atol=1e-12)
    # hidden gradients are per-rank partial sums (the TP region op adds them); weight gradients are per shard
    torch.testing.assert_close(parts[0]["gh"] + parts[1]["gh"], h.grad, rtol=0, atol=1e-12)
    gw = torch.cat([parts[0]["gw"], parts[1]["gw"]])
    torch.testing.assert_close(gw[:V], w.grad, rtol=0, atol=1e-12)
    assert torch.equal(gw[V:], torch.zeros_like(gw[V:]))  # padding rows get no gradient


def test_single_rank_equals_chunked_reference():
    hidden, weight, targets = _inputs()
    logp, ent = vocab_parallel_log_probs(hidden, weight, targets, 0, V, temperature=1.3, chunk_size=4,
                                         with_entropy=True, group=None)
    ref_logp, ref_ent = full_logits_log_probs(hidden, weight, targets, temperature=1.3, with_entropy=True)
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=1e-12)
    torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-12)
