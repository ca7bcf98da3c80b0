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
    """`packed=True` takes micro-batches as one packed row (data/sft_dataset.collate_packed) through varlen
    attention; with an `sp_group` each rank holds its slice of that row (Ulysses: attention trades the slices
    for heads) and sums the NLL of the tokens its slice predicts, so the group's losses add up to the row's."""

    def __init__(self, causal_lm: nn.Module, chunk_tokens: int = 4096, packed: bool = False, sp_group=None):
        super().__init__()
        if sp_group is not None and not packed:
            raise ValueError("Ulysses sequence parallelism needs packed micro-batches")
        self.lm = causal_lm
        self.chunk_tokens = chunk_tokens
        self.packed, self.sp_group = packed, sp_group
        if packed:
            from verlx.models.attention import use_packed_attention

            use_packed_attention(causal_lm)

    def decoder(self) -> nn.Module:
        """The causal LM's decoder stack (under the adapters of a PEFT model)."""
        lm = self.lm.get_base_model() if hasattr(self.lm, "get_base_model") else self.lm
        return lm.model

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        response_positions: torch.Tensor,
        targets: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cu_seqlens: torch.Tensor | None = None,
        cu_seqlens_host: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Sum over `response_positions` (flat indices into [batch * seq], or into this rank's packed slice) of
        -log p(targets | prefix)."""
        kwargs = {}
        if cu_seqlens is not None:
            from verlx.models.attention import packed_attention_kwargs

            kwargs = packed_attention_kwargs(cu_seqlens, cu_seqlens_host, self.sp_group)
        hidden = self.decoder()(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, **kwargs
        ).last_hidden_state.flatten(0, 1)
        hidden = hidden.index_select(0, response_positions)
        weight = self.lm.get_output_embeddings().weight
        total = hidden.new_zeros((), dtype=torch.float32)
        for start in range(0, hidden.shape[0], self.chunk_tokens):
            stop = start + self.chunk_tokens
            total = total + checkpoint(
                _chunk_nll, hidden[start:stop], weight, targets[start:stop], use_reentrant=False
            )
        return total
