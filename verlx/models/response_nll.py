"""Summed next-token NLL of selected positions of a causal LM, as one module FSDP can shard as its root.

The decoder runs once; logits are formed only at the response positions, in chunks that are recomputed in the
backward pass, so a large vocabulary never materialises [batch, seq, vocab] logits. Keeping the whole loss inside
`forward` means FSDP2's root hooks gather the embedding / lm_head before use and reduce their gradients after.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


def _chunk_nll(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = F.linear(hidden, weight).float()
    return F.cross_entropy(logits, targets, reduction="sum")


class ResponseNLL(nn.Module):
    def __init__(self, causal_lm: nn.Module, chunk_tokens: int = 4096):
        super().__init__()
        self.lm = causal_lm
        self.chunk_tokens = chunk_tokens

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        response_positions: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sum over `response_positions` (flat indices into [batch * seq]) of -log p(targets | prefix)."""
        hidden = self.lm.model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state
        hidden = hidden.flatten(0, 1).index_select(0, response_positions)
        weight = self.lm.get_output_embeddings().weight
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], self.chunk_tokens):
            stop = start + self.chunk_tokens
            total = total + checkpoint(
                _chunk_nll, hidden[start:stop], weight, targets[start:stop], use_reentrant=False
            )
        return total
