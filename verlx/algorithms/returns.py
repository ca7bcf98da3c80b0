"""Discounted sums along the response without a Python loop over tokens.

Responses can be thousands of tokens long, so the backward recursion x_t = b_t + c * x_{t+1} is evaluated as a
blocked scan: within blocks of `block` tokens by one small matrix product with the powers of c, across blocks by
a second, much smaller one. Arithmetic is float64, so the result matches the sequential recursion to ~1e-12.
"""

from __future__ import annotations

import torch


def _discount_matrix(discount: float, size: int, step: int, device: torch.device) -> torch.Tensor:
    """M[t, k] = discount ** (step * (k - t)) for k >= t, else 0."""
    offsets = torch.arange(size, device=device, dtype=torch.float64)
    exponent = (offsets[None, :] - offsets[:, None]) * step
    powers = torch.pow(torch.tensor(float(discount), dtype=torch.float64, device=device), exponent.clamp(min=0))
    return torch.where(exponent >= 0, powers, torch.zeros_like(powers))


def discounted_reverse_cumsum(x: torch.Tensor, discount: float, block: int = 64) -> torch.Tensor:
    """y_t = sum_{k >= t} discount^(k - t) * x_k along the last dim of a [B, R] tensor."""
    batch, length = x.shape
    if length == 0:
        return x.clone()
    block = min(block, length)
    num_blocks = -(-length // block)
    padded = torch.nn.functional.pad(x.to(torch.float64), (0, num_blocks * block - length))
    blocks = padded.view(batch, num_blocks, block)
    # Sums that start inside a block and stop at its end.
    local = torch.einsum("bnk,tk->bnt", blocks, _discount_matrix(discount, block, 1, x.device))
    # Value at the start of every block from that block to the end of the sequence.
    block_starts = torch.einsum("bi,ji->bj", local[:, :, 0], _discount_matrix(discount, num_blocks, block, x.device))
    carry = torch.nn.functional.pad(block_starts[:, 1:], (0, 1))  # value at the start of the next block
    to_block_end = torch.arange(block, 0, -1, device=x.device, dtype=torch.float64)  # tokens t .. block end
    decay = torch.pow(torch.tensor(float(discount), dtype=torch.float64, device=x.device), to_block_end)
    out = local + carry[:, :, None] * decay
    return out.reshape(batch, num_blocks * block)[:, :length].to(x.dtype)


def pack_valid_left(mask: torch.Tensor) -> torch.Tensor:
    """Per row, the positions of valid tokens in order followed by the others: gathering with it moves every row's
    valid tokens to a left-aligned prefix, so tokens outside the mask (padding, tool output) are skipped."""
    invalid_first_key = (~mask.bool()).to(torch.int8)
    return torch.sort(invalid_first_key, dim=-1, stable=True).indices


def unpack(packed: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Inverse of gathering with `order`: packed[:, j] goes back to position order[:, j]."""
    return torch.empty_like(packed).scatter_(-1, order, packed)
