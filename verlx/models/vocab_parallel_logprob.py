"""Log-probs and entropy when the output layer's vocabulary rows are sharded over tensor-parallel ranks.

Each rank holds W_r = rows [start, start + V_r) of the output weight and the full hidden states. Per chunk of
tokens: z_r = h W_rᵀ / T; the global max is one all-reduce (MAX); Σ exp(z − m), the target's logit and
Σ exp(z − m)·z are one all-reduce (SUM) of three floats per token. No rank ever holds more than a
[chunk, V_r] block of logits, and backward recomputes it.

The returned hidden-state gradient is this rank's partial sum: the caller's region op (megatron's
copy_to_tensor_model_parallel_region, or the sequence-parallel gather) sums it over the group, exactly as for
megatron's own column-parallel output layer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _all_reduce(t: torch.Tensor, op, group) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)
    return t


def _logits(h, weight, temperature, valid_cols):
    z = torch.matmul(h, weight.t())
    if z.dtype in (torch.bfloat16, torch.float16):
        z = z.float()
    if temperature != 1.0:
        z = z / temperature
    if valid_cols < z.shape[-1]:  # padding rows of the vocabulary never win
        z[:, valid_cols:] = float("-inf")
    return z


def _target_columns(targets, vocab_start, shard_rows):
    local = targets - vocab_start
    here = (local >= 0) & (local < shard_rows)
    return local.clamp(0, shard_rows - 1), here


class _VocabParallelLogProb(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, vocab_start, valid_cols, temperature, chunk_size, with_entropy, group):
        n, rows = hidden.shape[0], weight.shape[0]
        out_dtype = torch.float64 if hidden.dtype == torch.float64 else torch.float32
        logp = torch.empty(n, device=hidden.device, dtype=out_dtype)
        lse = torch.empty(n, device=hidden.device, dtype=out_dtype)
        mean_z = torch.empty(n, device=hidden.device, dtype=out_dtype)
        cols, here = _target_columns(targets, vocab_start, rows)
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            z = _logits(hidden[s:e], weight, temperature, valid_cols)
            m = _all_reduce(z.max(-1).values, dist.ReduceOp.MAX, group)
            ez = torch.exp(z - m.unsqueeze(-1))
            finite_z = z.masked_fill(~torch.isfinite(z), 0.0)
            target_z = z.gather(-1, cols[s:e].unsqueeze(-1)).squeeze(-1).masked_fill(~here[s:e], 0.0)
            sums = torch.stack([ez.sum(-1), target_z, (ez * finite_z).sum(-1)])
            _all_reduce(sums, dist.ReduceOp.SUM, group)
            lse[s:e] = m + torch.log(sums[0])
            logp[s:e] = sums[1] - lse[s:e]
            mean_z[s:e] = sums[2] / sums[0]
        ctx.save_for_backward(hidden, weight, targets, lse, mean_z)
        ctx.args = (vocab_start, valid_cols, temperature, chunk_size, with_entropy)
        entropy = lse - mean_z if with_entropy else torch.zeros(0, device=hidden.device)
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        hidden, weight, targets, lse, mean_z = ctx.saved_tensors
        vocab_start, valid_cols, t, chunk_size, with_entropy = ctx.args
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        rows = weight.shape[0]
        cols, here = _target_columns(targets, vocab_start, rows)
        grad_hidden = torch.empty_like(hidden) if need_h else None
        acc_dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
        grad_weight = torch.zeros(weight.shape, device=weight.device, dtype=acc_dtype) if need_w else None
        use_entropy = with_entropy and grad_entropy is not None and grad_entropy.numel() > 0
        for s in range(0, hidden.shape[0], chunk_size):
            e = min(s + chunk_size, hidden.shape[0])
            h = hidden[s:e]
            z = _logits(h, weight, t, valid_cols)
            p = torch.exp(z - lse[s:e].unsqueeze(-1).to(z.dtype))
            g = grad_logp[s:e].to(z.dtype)
            # d logp / dz = onehot(target) − p ;  d H / dz = −p (z − E_p[z])
            grad_z = -p * g.unsqueeze(-1)
            grad_z.scatter_add_(-1, cols[s:e].unsqueeze(-1), (g * here[s:e]).unsqueeze(-1))
            if use_entropy:
                finite_z = z.masked_fill(~torch.isfinite(z), 0.0)
                centred = finite_z - mean_z[s:e].unsqueeze(-1).to(z.dtype)
                grad_z -= grad_entropy[s:e].to(z.dtype).unsqueeze(-1) * p * centred
            if t != 1.0:
                grad_z = grad_z / t
            grad_z = grad_z.to(h.dtype)
            if need_h:
                grad_hidden[s:e] = torch.matmul(grad_z, weight.to(h.dtype))
            if need_w:
                grad_weight += torch.matmul(grad_z.t(), h).to(acc_dtype)
        if need_w:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None


def vocab_parallel_log_probs(
    hidden: torch.Tensor,
    weight_shard: torch.Tensor,
    targets: torch.Tensor,
    vocab_start: int,
    vocab_size: int,
    temperature: float = 1.0,
    chunk_size: int = 1024,
    with_entropy: bool = False,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log softmax(h Wᵀ / T)[target] (and the entropy) over the whole vocabulary, for hidden [..., H] and
    targets [...] (global token ids), with this rank holding rows [vocab_start, vocab_start + len(weight_shard)).

    Rows at or past `vocab_size` (padding that makes the vocabulary divisible by the group size) are ignored.
    Collective over `group`: every rank calls it with the same hidden states and targets.
    """
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    shape = targets.shape
    flat_h = hidden.reshape(-1, hidden.shape[-1])
    flat_t = targets.reshape(-1).long()
    valid_cols = max(0, min(weight_shard.shape[0], vocab_size - vocab_start))
    logp, entropy = _VocabParallelLogProb.apply(flat_h, weight_shard, flat_t, int(vocab_start), int(valid_cols),
                                                float(temperature), int(chunk_size), bool(with_entropy), group)
    return logp.view(shape), (entropy.view(shape) if with_entropy else None)


@torch.no_grad()
def vocab_parallel_sum_pi_squared(hidden: torch.Tensor, weight_shard: torch.Tensor, vocab_start: int, vocab_size: int,
                                  temperature: float = 1.0, chunk_size: int = 1024,
                                  group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """sum_v softmax(h Wᵀ / T)_v² over the whole vocabulary, [..., H] → [...], with this rank holding rows
    [vocab_start, vocab_start + len(weight_shard)): per chunk one all-reduce (MAX) of the max logit m and one (SUM)
    of sum exp(z - m) and sum exp(2(z - m)); the result is the second over the first squared. Collective."""
    if chunk_size <= 0:
        raise ValueError(f"chunk_size must be positive, got {chunk_size}")
    flat = hidden.reshape(-1, hidden.shape[-1])
    valid_cols = max(0, min(weight_shard.shape[0], vocab_size - vocab_start))
    out = torch.empty(flat.shape[0], device=hidden.device,
                      dtype=torch.float64 if hidden.dtype == torch.float64 else torch.float32)
    for s in range(0, flat.shape[0], chunk_size):
        z = _logits(flat[s:s + chunk_size], weight_shard, temperature, valid_cols)
        m = _all_reduce(z.max(-1).values, dist.ReduceOp.MAX, group)
        ez = torch.exp(z - m.unsqueeze(-1))
        sums = _all_reduce(torch.stack([ez.sum(-1), ez.square().sum(-1)]), dist.ReduceOp.SUM, group)
        out[s:s + chunk_size] = sums[1] / sums[0].square()
    return out.reshape(hidden.shape[:-1])
