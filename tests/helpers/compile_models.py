"""Tiny Qwen2 models and packed batches shared by the torch.compile tests."""

from __future__ import annotations

import torch

VOCAB = 61


def tiny_config():
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                       attn_implementation="sdpa")


def packed_batch(seed: int, rows: int, prompt: int = 6, response: int = 5):
    """Random left-padded prompts and right-padded responses: the packed length differs with every seed."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (rows, prompt + response), generator=g)
    p = torch.randint(1, prompt + 1, (rows,), generator=g)
    r = torch.randint(1, response + 1, (rows,), generator=g)
    cols = torch.arange(prompt + response)
    mask = ((cols >= prompt - p[:, None]) & (cols < prompt + r[:, None])).long()
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), response


def grads(model):
    """Parameter gradients by name (whole tensors also for FSDP2's sharded DTensor gradients)."""
    return {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone())
            for n, p in model.named_parameters() if p.grad is not None}


def assert_fp32_close(want, got, what: str):
    """fp32 agreement up to rounding: inductor sums in another order (1e-6 of the largest entry)."""
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6 * max(want.abs().max().item(), 1.0), msg=what)


def train_step(model, batch, chunk_size=4, with_entropy=False):
    ids, mask, pos, resp = batch
    model.zero_grad(set_to_none=True)
    lp, ent = model(ids, mask, pos, resp, temperature=0.8, chunk_size=chunk_size, with_entropy=with_entropy)
    rmask = mask[:, -resp:].bool()
    weights = torch.linspace(-1, 1, rmask.numel()).reshape(rmask.shape)
    loss = (lp * weights)[rmask].sum() + (0.3 * ent[rmask].sum() if with_entropy else 0)
    loss.backward()
    return lp.detach(), ent.detach() if with_entropy else None, grads(model)
