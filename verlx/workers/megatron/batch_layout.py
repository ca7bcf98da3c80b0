"""Left-aligning a padded RL batch so megatron needs only a causal mask.

verlx batches are [left-padded prompt | right-padded response]. Shifting every row left by its number of leading
pads puts the real tokens at positions 0..len−1: RoPE then sees the same positions as HF's position_ids, and any
padding is at the end where causal attention never lets a real token read it. The sequence is cut to the longest
row (rounded up for sequence parallelism), so short batches cost less.

Computed on CPU before the tensors go to the GPU: no device synchronisation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AlignedBatch:
    input_ids: torch.Tensor  # [b, S'] left-aligned tokens (padding after the real ones)
    hidden_index: torch.Tensor  # [b, R] the aligned position whose hidden state predicts response token j
    targets: torch.Tensor  # [b, R] the response tokens

    def to(self, device: torch.device) -> AlignedBatch:
        return AlignedBatch(*(t.to(device, non_blocking=True) for t in (self.input_ids, self.hidden_index,
                                                                         self.targets)))


def align_batch(input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
                multiple_of: int = 1) -> AlignedBatch:
    """Left-align rows whose real tokens are one contiguous run; `multiple_of` pads the length (SP needs TP | S')."""
    b, s = input_ids.shape
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    shift = mask.int().argmax(-1)  # index of the first real token
    last = s - 1 - mask.flip(-1).int().argmax(-1)
    holes = (last - shift + 1) != lengths
    if bool(holes.any()):
        row = int(holes.nonzero()[0, 0])
        raise ValueError(f"row {row} of the batch has padding between real tokens (attention_mask "
                         f"{mask[row].int().tolist()}); the megatron backend needs one contiguous run per row")
    longest = int(lengths.max())
    width = -(-longest // multiple_of) * multiple_of
    positions = torch.arange(width).unsqueeze(0)
    gather = (shift.unsqueeze(1) + positions).clamp(max=s - 1)
    aligned = input_ids.gather(1, gather)
    prompt_width = s - response_length
    j = torch.arange(response_length).unsqueeze(0)
    hidden_index = (prompt_width - shift.unsqueeze(1) - 1 + j).clamp(0, width - 1)
    return AlignedBatch(aligned, hidden_index, input_ids[:, prompt_width:])
