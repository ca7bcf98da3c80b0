"""How far two runs of one float32 computation may differ when only the order of its sums changes.

A batch of another composition (requests joining mid-decode, a different number of rows, a prefix reused from the
cache) makes the CPU kernels pick other blockings and vector widths, so the same sums are added in another order.
Each order of a sum of K terms is within K·u of the exact sum, relative to the terms' magnitude (u = 2^-24, float32's
unit roundoff), so two orders are within 2·K·u of each other; the reductions along one token's path through the
network chain, so their lengths add up. This is a first-order worst case, far above what reordering does in
practice (about 1e-5 on the tiny models) and far below what a real mistake does (a wrong position, temperature or
token changes log-probs by 0.1 or more, and the token ids are compared exactly as well).
"""

from __future__ import annotations

UNIT_ROUNDOFF_FP32 = 2.0**-24


def decoder_reduction_length(hf_config, context_tokens: int) -> int:
    """Terms summed along one token's path through a decoder: in each layer the q/k/v projections (hidden), the
    attention scores (head_dim), the weighted values (up to context_tokens), the output projection (hidden) and the
    MLP (hidden, then intermediate); then the LM head (hidden) and the log-softmax over the vocabulary."""
    hidden, layers = hf_config.hidden_size, hf_config.num_hidden_layers
    head_dim = getattr(hf_config, "head_dim", None) or hidden // hf_config.num_attention_heads
    per_layer = hidden + head_dim + context_tokens + hidden + hidden + hf_config.intermediate_size
    return layers * per_layer + hidden + hf_config.vocab_size


def reorder_tolerance(reduction_length: int, magnitude: float) -> float:
    """The largest difference reordering the sums can make to a result of about `magnitude` (at least 1)."""
    return 2 * reduction_length * UNIT_ROUNDOFF_FP32 * max(1.0, magnitude)
