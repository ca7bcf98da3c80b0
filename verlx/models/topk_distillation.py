"""Top-k forward KL of on-policy distillation (veRL's loss_mode=forward_kl_topk), a chunk of tokens at a time.

The teacher gives, at each response position, its k most likely next tokens and their log-probs; the student's loss
there is Σ_k p_t(k) (log p_t(k) − log p_s(k)) over those k tokens (the forward KL restricted to the teacher's
top-k), with both log-probs clamped below at log_prob_min_clamp when set. Neither side keeps a [tokens, vocab]
block beyond one chunk: the teacher's top-k is taken chunk by chunk, and the student's chunks are recomputed in
backward (activation checkpointing), like verlx.models.chunked_logprob.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

from verlx.models.chunked_logprob import scaled_logits


@torch.no_grad()
def chunked_topk_log_probs(hidden: torch.Tensor, weight: torch.Tensor, k: int, temperature: float = 1.0,
                           chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest log softmax(h Wᵀ / T) per token and their token ids, [..., H] → ([..., k] int64, [..., k]
    fp32), largest first."""
    if chunk_size <= 0 or k <= 0:
        raise ValueError(f"chunk_size and k must be positive, got {chunk_size} and {k}")
    flat = hidden.reshape(-1, hidden.shape[-1])
    ids = torch.empty((flat.shape[0], k), dtype=torch.long, device=hidden.device)
    log_probs = torch.empty((flat.shape[0], k), dtype=torch.float32, device=hidden.device)
    for start in range(0, flat.shape[0], chunk_size):
        z = scaled_logits(flat[start:start + chunk_size], weight, temperature)
        top = torch.topk(z, k, dim=-1)
        ids[start:start + chunk_size] = top.indices
        log_probs[start:start + chunk_size] = top.values - torch.logsumexp(z, dim=-1, keepdim=True)
    shape = (*hidden.shape[:-1], k)
    return ids.reshape(shape), log_probs.reshape(shape)


def _topk_kl_chunk(h, weight, teacher_ids, teacher_log_probs, temperature: float, min_clamp: float | None):
    z = scaled_logits(h, weight, temperature)
    student = torch.gather(z, -1, teacher_ids) - torch.logsumexp(z, dim=-1, keepdim=True)
    student_mass = student.detach().exp().sum(-1)
    teacher = teacher_log_probs.to(z.dtype)
    if min_clamp is not None:
        student, teacher = student.clamp_min(min_clamp), teacher.clamp_min(min_clamp)
    return (teacher.exp() * (teacher - student)).sum(-1), student_mass


def chunked_topk_forward_kl(hidden: torch.Tensor, weight: torch.Tensor, teacher_ids: torch.Tensor,
                            teacher_log_probs: torch.Tensor, temperature: float = 1.0, chunk_size: int = 1024,
                            log_prob_min_clamp: float | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(forward KL over the teacher's top-k per token, the student's probability mass on those k tokens) for
    hidden [..., H] and the teacher's ids / log-probs [..., k] → [...] each (fp32; fp64 for fp64 inputs).
    Differentiable in `hidden` and `weight` (the mass is not); one [chunk_size, vocab] block at a time, recomputed
    in backward."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    k = teacher_ids.shape[-1]
    h = hidden.reshape(-1, hidden.shape[-1])
    ids = teacher_ids.reshape(-1, k).long()
    lps = teacher_log_probs.reshape(-1, k).detach()
    parts = [checkpoint(_topk_kl_chunk, h[s:s + chunk_size], weight, ids[s:s + chunk_size], lps[s:s + chunk_size],
                        float(temperature), log_prob_min_clamp, use_reentrant=False)
             for s in range(0, h.shape[0], chunk_size)]
    dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
    kl = torch.cat([p[0] for p in parts]) if parts else h.new_zeros(0, dtype=dtype)
    mass = torch.cat([p[1] for p in parts]) if parts else h.new_zeros(0, dtype=dtype)
    return kl.reshape(hidden.shape[:-1]), mass.reshape(hidden.shape[:-1])
