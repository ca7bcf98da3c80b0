"""Masked statistics, loss aggregation, the PPO value loss and entropy: the pieces every loss shares.

Every function here is pure tensor code without host syncs, so it can sit inside a micro-batch loop.
Masks are 0/1 (bool, int or float); positions outside the mask never leak into a result, not even NaNs.
"""

from __future__ import annotations

import torch

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _nonzero_or_one(count: torch.Tensor) -> torch.Tensor:
    """The count itself, or 1 where it is 0: an empty selection then averages to 0 instead of NaN."""
    return torch.where(count > 0, count, torch.ones_like(count))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Sum of x where mask is non-zero (weighted by the mask); values outside the mask are ignored even if NaN."""
    weighted = torch.where(mask.bool(), x * mask, torch.zeros_like(x))
    return weighted.sum() if dim is None else weighted.sum(dim=dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | tuple[int, ...] | None = None) -> torch.Tensor:
    """Mean of x over the mask; 0 (not NaN) where the mask selects nothing."""
    count = mask.sum() if dim is None else mask.sum(dim=dim)
    return masked_sum(x, mask, dim) / _nonzero_or_one(count.to(x.dtype))


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of x over the whole mask (two-pass, so large means do not cancel away precision).

    With fewer than two selected elements the unbiased variance is undefined; it is returned as 0.
    """
    mean = masked_mean(x, mask)
    var = masked_mean((x - mean) ** 2, mask)
    if unbiased:
        count = mask.sum().to(var.dtype)
        var = torch.where(count > 1, var * count / (count - 1).clamp(min=1), torch.zeros_like(var))
    return var


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x - mean) / std over the mask; with shift_mean=False the mean is added back after scaling."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def agg_loss_counts(loss_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(num_tokens, num_seqs) of one batch as agg_loss counts them: valid tokens, and sequences with at least
    one valid token. Sum these over a rank's micro-batches and all-reduce over ranks to get the totals."""
    return loss_mask.sum(), (loss_mask.sum(dim=-1) > 0).sum()


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    *,
    num_tokens: torch.Tensor | float | None = None,
    num_seqs: torch.Tensor | float | None = None,
    norm_length: float | None = None,
    dp_size: int | torch.Tensor = 1,
    weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a [B, R] per-token loss to a scalar.

    Modes (l = loss, m = mask, i = sequence, t = token):
      token-mean               sum_it l*m / num_tokens
      token-sum                sum_it l*m * dp_size                           (no normalisation at all)
      seq-mean-token-sum       sum_i (sum_t l*m) / num_seqs
      seq-mean-token-mean      sum_i (sum_t l*m / sum_t m) / num_seqs
      seq-mean-token-sum-norm  sum_i (sum_t l*m / norm_length) / num_seqs      (Dr.GRPO; norm_length defaults
                               to R = loss_mat.shape[-1]; pass a constant such as the max response length;
                               veRL 0.9.1 divides by the sequence count too, and calls norm_length
                               loss_scale_factor)
    Sequences without valid tokens add 0 and are not counted in the default num_seqs.

    Micro-batching: with num_tokens / num_seqs None this batch's own counts are used (a plain mean). To train on a
    mini-batch split into micro-batches and data-parallel ranks, pass the same counts to every call:
      num_tokens = (valid tokens in the whole mini-batch, all ranks) / dp_size
      num_seqs   = (sequences with >= 1 valid token in the whole mini-batch, all ranks) / dp_size
    (agg_loss_counts gives one batch's counts.) Then the sum of the returned losses over a rank's micro-batches,
    averaged over ranks as FSDP averages gradients, is exactly the mini-batch loss. If gradients are summed over
    ranks instead, pass the undivided totals. For seq-mean-token-sum-norm every call must use the same norm_length.
    token-sum has no count to divide by: each rank's sum is multiplied by `dp_size` (the number of data-parallel
    ranks whose gradients the backend averages), so the averaged gradient is that of the sum over all ranks.

    `weights` [B, R] (rollout-correction IS weights, algorithms/rollout_correction.py) multiply each token's loss
    before the reduction; the counts are not weighted. None leaves the loss untouched.
    """
    if weights is not None:
        loss_mat = loss_mat * weights.to(loss_mat.dtype)
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        total = masked_sum(loss_mat, mask)
        if num_tokens is None:
            num_tokens = mask.sum()
        return total / _normaliser(num_tokens, total)
    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, mask) * dp_size
    seq_tokens = mask.sum(dim=-1)
    seq_sums = masked_sum(loss_mat, mask, dim=-1)
    if loss_agg_mode == "seq-mean-token-sum":
        seq_losses = seq_sums
    elif loss_agg_mode == "seq-mean-token-mean":
        seq_losses = seq_sums / _nonzero_or_one(seq_tokens)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        seq_losses = seq_sums / (loss_mat.shape[-1] if norm_length is None else norm_length)
    else:
        raise ValueError(f"unknown loss_agg_mode '{loss_agg_mode}'; use one of {', '.join(LOSS_AGG_MODES)}")
    total = seq_losses.sum()
    if num_seqs is None:
        num_seqs = (seq_tokens > 0).sum()
    return total / _normaliser(num_seqs, total)


def _normaliser(count: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    count = torch.as_tensor(count, dtype=like.dtype, device=like.device)
    return _nonzero_or_one(count)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    **agg_kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """PPO clipped value loss 0.5 * max((v - R)^2, (clip(v, v_old ± c) - R)^2) and the fraction of tokens where
    the clipped term is the larger one. agg_kwargs (num_tokens, num_seqs, norm_length) go to agg_loss."""
    clipped = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
    unclipped_loss = (vpreds - returns) ** 2
    clipped_loss = (clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(unclipped_loss, clipped_loss), response_mask, loss_agg_mode, **agg_kwargs)
    vf_clipfrac = masked_mean((clipped_loss > unclipped_loss).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac.detach()


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dim, -sum p log p with log p = z - logsumexp(z): shifting by the
    logsumexp first keeps it exact for large logits. -inf logits (masked vocabulary entries) contribute 0.
    Callers chunk the rows; this keeps two extra [N, V] temporaries. bf16/fp16 logits are reduced in float32."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    log_probs = logits - torch.logsumexp(logits, dim=-1, keepdim=True)
    probs = torch.exp(log_probs)
    return -torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs)).sum(dim=-1)
