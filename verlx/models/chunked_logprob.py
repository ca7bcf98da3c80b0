"""Log-probs and entropy of target tokens straight from hidden states, a chunk of tokens at a time.

A [tokens, vocab] logits tensor for 16k tokens × 151k vocabulary is 9.7 GB in fp32; autograd would also keep every
chunk's logits for backward. This autograd function keeps only the hidden states, the target ids and two floats
per token, and recomputes each chunk's logits in backward.

With `compiled=True` the per-chunk arithmetic after the matmul (upcast, log-sum-exp, gather, entropy; in backward
p = exp(z - lse) and the logit gradient) runs as torch.compile'd fused kernels: one read of the bf16 logits forward
and one read plus one bf16 write backward, instead of ~10 passes over fp32 [chunk, vocab] blocks.
"""

from __future__ import annotations

import torch


def scaled_logits(hidden: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
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
    and one fused-in-place gradient, with no second log-sum-exp. `compiled` fuses each side into one pass.
    """

    @staticmethod
    def forward(ctx, hidden, weight, targets, temperature, chunk_size, with_entropy, out_shape, compiled):
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
            if compiled:
                z = torch.matmul(hidden[start:end], weight.t())
                stats = _compiled("stats")(z, targets[start:end], temperature, with_entropy)
                lse[start:end], flat_logp[start:end] = stats[0], stats[1]
                if with_entropy:
                    flat_entropy[start:end] = stats[2]
                continue
            z = scaled_logits(hidden[start:end], weight, temperature)
            chunk_lse = torch.logsumexp(z, dim=-1)
            lse[start:end] = chunk_lse
            flat_logp[start:end] = z.gather(-1, targets[start:end].unsqueeze(-1)).squeeze(-1) - chunk_lse
            if with_entropy:  # H = -Σ p log p: a sum of non-negative terms (lse - Σ p z would cancel)
                log_p = z.sub_(chunk_lse.unsqueeze(-1))
                flat_entropy[start:end] = -_row_dot(torch.exp(log_p), log_p)
        saved_entropy = flat_entropy.clone() if with_entropy else lse.new_zeros(0)  # not a view of an output
        ctx.save_for_backward(hidden, weight, targets, lse, saved_entropy)
        ctx.temperature, ctx.chunk_size, ctx.with_entropy = temperature, chunk_size, with_entropy
        ctx.compiled = compiled
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
            ent, g_ent = (entropy[start:end], grad_entropy[start:end]) if use_entropy else (None, None)
            if ctx.compiled:
                z = torch.matmul(h, weight.t())
                grad_z = _compiled("grad")(z, lse[start:end], grad_logp[start:end], targets[start:end], t, ent, g_ent)
            else:
                grad_z = _eager_logit_grad(h, weight, t, lse[start:end], grad_logp[start:end], targets[start:end], ent,
                                           g_ent)
            if need_h:
                grad_hidden[start:end] = torch.matmul(grad_z, weight.to(h.dtype))
            if need_w:
                grad_weight += torch.matmul(grad_z.t(), h).to(acc_dtype)
        if need_w:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None


def _eager_logit_grad(h, weight, t, lse, grad_logp, targets, entropy, grad_entropy):
    """dL/dz of one chunk in h's dtype, in place on one fp32 [chunk, vocab] block (the uncompiled path)."""
    g_lp = grad_logp.unsqueeze(-1)
    # log p = z - lse;  d logp_t / dz = onehot(t) - p;  d H / dz = -p (log p + H)
    log_p = scaled_logits(h, weight, t).sub_(lse.unsqueeze(-1))
    p = torch.exp(log_p)
    if entropy is not None:
        coeff = log_p.add_(entropy.unsqueeze(-1)).mul_(grad_entropy.unsqueeze(-1))
        grad_z = p.mul_(coeff.add_(g_lp)).neg_()
    else:
        grad_z = p.mul_(g_lp).neg_()
    grad_z.scatter_add_(-1, targets.unsqueeze(-1), g_lp)
    return grad_z.to(h.dtype)


def _upcast(z: torch.Tensor) -> torch.Tensor:
    return z.float() if z.dtype in (torch.bfloat16, torch.float16) else z


def _chunk_stats(z, targets, temperature: float, with_entropy: bool):
    """(lse, log p[target], entropy or None) of one chunk's raw logits z = h Wᵀ, in fp32 (compiled: one kernel)."""
    z = _upcast(z) / temperature
    lse = torch.logsumexp(z, dim=-1)
    logp = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
    if not with_entropy:
        return lse, logp, None
    log_p = z - lse.unsqueeze(-1)
    return lse, logp, -(torch.exp(log_p) * log_p).sum(-1)


def _chunk_logit_grad(z, lse, grad_logp, targets, temperature: float, entropy, grad_entropy):
    """dL/dz of one chunk from its raw logits, in z's dtype; the same arithmetic as `_eager_logit_grad`, written
    out of place with the one-hot as a comparison so that inductor fuses it into one pass."""
    log_p = _upcast(z) / temperature - lse.unsqueeze(-1)
    p = torch.exp(log_p)
    g_lp = grad_logp.unsqueeze(-1)
    if entropy is not None:
        grad = -p * ((log_p + entropy.unsqueeze(-1)) * grad_entropy.unsqueeze(-1) + g_lp)
    else:
        grad = -p * g_lp
    vocab = torch.arange(z.shape[-1], device=z.device)
    grad = torch.where(vocab.unsqueeze(0) == targets.unsqueeze(-1), grad + g_lp, grad)
    return grad.to(z.dtype)


_COMPILED: dict[str, object] = {}


def _compiled(name: str):
    """The torch.compile'd chunk function (dynamic: the last chunk is shorter), built on first use."""
    if name not in _COMPILED:
        fn = {"stats": _chunk_stats, "grad": _chunk_logit_grad}[name]
        _COMPILED[name] = torch.compile(fn, dynamic=True)
    return _COMPILED[name]


def chunked_log_probs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    compiled: bool = False,
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
                                          tuple(shape), bool(compiled))
    return logp, (entropy if with_entropy else None)


@torch.no_grad()
def chunked_sum_pi_squared(hidden: torch.Tensor, weight: torch.Tensor, temperature: float = 1.0,
                           chunk_size: int = 1024) -> torch.Tensor:
    """sum_v softmax(h Wᵀ / T)_v² per token, [..., H] → [...] (fp32; fp64 for fp64 inputs), a chunk of tokens at a
    time: exp(logsumexp(2z) - 2 logsumexp(z)). No gradient: the optimal token baseline reads it as data."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    flat = hidden.reshape(-1, hidden.shape[-1])
    out = torch.empty(flat.shape[0], device=hidden.device,
                      dtype=torch.float64 if hidden.dtype == torch.float64 else torch.float32)
    for start in range(0, flat.shape[0], chunk_size):
        z = scaled_logits(flat[start:start + chunk_size], weight, temperature)
        out[start:start + chunk_size] = torch.exp(torch.logsumexp(2 * z, dim=-1) - 2 * torch.logsumexp(z, dim=-1))
    return out.reshape(hidden.shape[:-1])


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
