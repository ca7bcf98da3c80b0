"""Log-probs and entropy of target tokens straight from hidden states, a chunk of tokens at a time.

A [tokens, vocab] logits tensor for 16k tokens × 151k vocabulary is 9.7 GB in fp32; autograd would also keep every
chunk's logits for backward. This autograd function keeps only the hidden states, the target ids and two floats
per token, and recomputes each chunk's logits in backward.
"""

from __future__ import annotations

import torch


def _scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """z = h Wᵀ / T for one chunk, fp32 for half inputs (a fresh tensor the caller may modify in place)."""
    z = torch.matmul(hidden, weight.t())
    if z.dtype in (torch.bfloat16, torch.float16):
        z = z.float()
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _row_dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_v a[n, v] b[n, v] without materialising the product."""
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).reshape(a.shape[0])


class _ChunkedLogProb(torch.autograd.Function):
    """Saves h, W, targets and the per-token log-sum-exp (and entropy); backward recomputes one chunk's logits.

    Passes over a [chunk, vocab] block are what this costs (memory-bound): forward is the matmul, one cast and
    the log-sum-exp (+ exp and a row dot product for the entropy); backward is the matmul, p = exp(z - lse)
    and one fused-in-place gradient, with no second log-sum-exp.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_size, with_entropy, out_shape):
        n = hidden.shape[0]
        out_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        # outputs are allocated in their final shape (not views of flat buffers): FSDP's output hooks need that
        logp = torch.empty(out_shape, device=hidden.device, dtype=out_dtype)
        entropy = torch.empty(out_shape, device=hidden.device, dtype=out_dtype) if with_entropy else None
        lse = torch.empty(n, device=hidden.device, dtype=out_dtype)
        flat_logp = logp.view(-1)
        flat_entropy = entropy.view(-1) if with_entropy else None
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            z = _scaled_logits(hidden[start:end], weight, temperature)
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[start:end] = chunk_lse
            flat_logp[start:end] = z.gather(-1, targets[start:end].unsqueeze(-1)).squeeze(-1) - chunk_lse
            if with_entropy:
                p = torch.exp(z - chunk_lse.unsqueeze(-1))
                flat_entropy[start:end] = chunk_lse - _row_dot(p, z)
        saved_entropy = flat_entropy.clone() if with_entropy else lse.new_zeros(0)  # not a view of an output
        ctx.save_for_backward(hidden, weight, targets, lse, saved_entropy)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        return (logp, entropy) if with_entropy else (logp, torch.zeros(0, device=hidden.device))

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, lse, entropy = ctx.saved_tensors
        t = ctx.temperature
        # the 1/T of z = h Wᵀ / T is folded into the incoming gradients (grad_z is linear in them)
        grad_logp = grad_logp.reshape(-1) / t
        use_entropy = ctx.with_entropy and grad_entropy is not None and grad_entropy.numel() > 0
        if use_entropy:
            grad_entropy = grad_entropy.reshape(-1) / t
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_h else None
        acc_dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
        grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=acc_dtype) if need_w else None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            end = min(start + ctx.chunk_size, hidden.shape[0])
            h = hidden[start:end]
            g_lp = grad_logp[start:end].unsqueeze(-1)
            # log p = z - lse;  d logp_t / dz = onehot(t) - p;  d H / dz = -p (log p + H)
            log_p = _scaled_logits(h, weight, t).sub_(lse[start:end].unsqueeze(-1))
            p = torch.exp(log_p)
            if use_entropy:
                coeff = log_p.add_(entropy[start:end].unsqueeze(-1)).mul_(grad_entropy[start:end].unsqueeze(-1))
                grad_z = p.mul_(coeff.add_(g_lp)).neg_()
            else:
                grad_z = p.mul_(g_lp).neg_()
            grad_z.scatter_add_(-1, targets[start:end].unsqueeze(-1), g_lp)
            grad_z = grad_z.to(h.dtype)
            if need_h:
                grad_hidden[start:end] = torch.matmul(grad_z, weight.to(h.dtype))
            if need_w:
                grad_weight += torch.matmul(grad_z.t(), h).to(acc_dtype)
        if need_w:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(h Wᵀ / T)[target] (and the entropy) for hidden [..., H], targets [...].

    Results are fp32 (fp64 for fp64 inputs) whatever the input dtype.

    Differentiable in `hidden` and `weight`; peak extra memory is one [chunk_size, vocab] block.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    shape = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1).long()
    logp, entropy = _ChunkedLogProb.apply(flat_h, weight, flat_t, float(temperature), int(chunk_size), with_entropy,
                                          tuple(shape))
    return logp, (entropy if with_entropy else None)


def full_logits_log_probs(hidden, weight, targets, temperature: float = 1.0, with_entropy: bool = False):
    """The plain reference: materialise all logits (used by tests and the memory benchmark)."""
    z = torch.matmul(hidden, weight.t())
    z = (z.float() if z.dtype in (torch.bfloat16, torch.float16) else z) / temperature
    logp_all = torch.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1).long()).squeeze(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1) if with_entropy else None
    return logp, entropy


def _kl_chunk(h, weight, h_ref, ref_weight, temperature: float):
    from verlx.algorithms.kl import full_kl_from_logits

    logits = torch.matmul(h, weight.t()) / temperature
    ref_logits = torch.matmul(h_ref, ref_weight.t()) / temperature
    return full_kl_from_logits(logits, ref_logits)


def chunked_full_kl(hidden, weight, ref_hidden, ref_weight, temperature: float = 1.0, chunk_size: int = 1024):
    """Exact KL(π ‖ π_ref) per token over the whole vocabulary, [..., H] → [...].

    Each chunk's two logit blocks are recomputed in backward (activation checkpointing), so memory stays one chunk
    of [chunk_size, vocab] at a time; gradients flow to `hidden` and `weight` only.
    """
    from torch.utils.checkpoint import checkpoint

    shape = hidden.shape[:-1]
    h = hidden.reshape(-1, hidden.shape[-1])
    h_ref = ref_hidden.reshape(-1, ref_hidden.shape[-1]).detach()
    ref_weight = ref_weight.detach()
    parts = [
        checkpoint(_kl_chunk, h[s:s + chunk_size], weight, h_ref[s:s + chunk_size], ref_weight, float(temperature),
                   use_reentrant=False)
        for s in range(0, h.shape[0], chunk_size)
    ]
    return torch.cat(parts).reshape(shape)
