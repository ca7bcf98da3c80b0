"""ScoreModel: a HF sequence-classification checkpoint (decoder + one-label `score` head) that gives each sequence's
score at its last real token, as the checkpoint's own forward pools it; the reward model's module.

Only the last token's hidden state goes through the head (never [B, S, labels]). Padded: the decoder runs on the
[B, S] batch with its attention mask; packed (use_remove_padding): on the real tokens of every sequence in one row.
"""

from __future__ import annotations

import torch
from torch import nn

from verlx.models.attention import packed_attention_kwargs, use_packed_attention
from verlx.models.packing import cu_seqlens_from_lengths
from verlx.models.policy import _decoder_forward, packed_decoder_forward


def last_token_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B] position of each row's last real token (left or right padding alike)."""
    positions = torch.arange(1, attention_mask.shape[-1] + 1, device=attention_mask.device)
    return (attention_mask.long() * positions).argmax(-1)


class ScoreModel(nn.Module):
    """`decoder` is the checkpoint's base model, `score` its classification head; forward → [B] float32 scores."""

    def __init__(self, decoder: nn.Module, score: nn.Linear, packed: bool = False):
        super().__init__()
        if score.out_features != 1:
            raise ValueError(f"the reward model's score head has {score.out_features} labels; a reward model scores "
                             "with one (num_labels=1)")
        self.decoder = decoder
        self.score = score
        self.packed = packed
        if packed:
            use_packed_attention(decoder)

    @property
    def config(self):
        return self.decoder.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor
                ) -> torch.Tensor:
        hidden = self._last_hidden(input_ids, attention_mask, position_ids)
        return self.score(hidden.to(self.score.weight.dtype)).squeeze(-1).float()

    def _last_hidden(self, input_ids, attention_mask, position_ids) -> torch.Tensor:
        if not self.packed:
            hidden = _decoder_forward(self.decoder, input_ids, attention_mask, position_ids)
            rows = torch.arange(input_ids.shape[0], device=input_ids.device)
            return hidden[rows, last_token_index(attention_mask)]
        mask = attention_mask.bool()
        lengths = mask.sum(-1).cpu()
        cu_host = cu_seqlens_from_lengths(lengths.tolist())
        cu = cu_host.to(input_ids.device, non_blocking=True)
        hidden = packed_decoder_forward(self.decoder, input_ids[mask].unsqueeze(0), position_ids[mask].unsqueeze(0),
                                        **packed_attention_kwargs(cu, cu_host))
        return hidden[0, cu[1:].long() - 1]
