"""Qwen2-VL's multimodal rotary positions (M-RoPE): three position axes (time, height, width) per token. Qwen2.5-VL
and Qwen3-VL give an image's tokens the same positions (Qwen3-VL interleaves the axes' frequencies inside its
rotary embedding, which takes the same three axes).

A text token has the same position on all three axes, one more than the token before it. An image of grid
(t, h, w) patches (h and w merged by `merge` into one token each `merge` x `merge` patches) is t * h/m * w/m
tokens; its tokens sit at the position where the image starts plus their (time, row, column) in the merged grid,
and the text after it resumes at that start plus max(h, w)/m. These are the positions transformers' Qwen2-VL
computes in `get_rope_index`; here they are computed once per row when the batch is built, without a Python loop
over tokens, and travel in the batch's position_ids as veRL lays them out: [B, 4, T], row 0 the plain text
positions, rows 1-3 the three M-RoPE axes.
"""

from __future__ import annotations

import torch

#: rows of a vision-language batch's position_ids [B, 4, T]: the text positions, then the three M-RoPE axes
TEXT_AXIS = 0
MROPE_AXES = slice(1, 4)
POSITION_ROWS = 4


def image_token_counts(image_grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """Tokens each image takes in the prompt, [N]: its grid's patches over merge^2."""
    return image_grid_thw.prod(-1) // (merge * merge)


def _grid_offsets(grid: list[int], merge: int) -> torch.Tensor:
    """(time, row, column) of each token of one image in the merged grid, [3, t * h/m * w/m], row-major."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    return torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij")).reshape(3, -1)


def row_mrope_positions(input_ids: torch.Tensor, image_grid_thw: torch.Tensor | None, image_token_id: int,
                        merge: int) -> torch.Tensor:
    """M-RoPE positions [3, L] of one row's real tokens `input_ids` [L] (no padding); `image_grid_thw` [N, 3] are
    its images in the order their tokens appear. Raises when the image tokens do not add up to the grids."""
    is_image = input_ids == image_token_id
    num_image_tokens = int(is_image.sum())
    grids = image_grid_thw.tolist() if image_grid_thw is not None else []
    counts = [g[0] * (g[1] // merge) * (g[2] // merge) for g in grids]
    if num_image_tokens != sum(counts):
        raise ValueError(f"the row has {num_image_tokens} image tokens, but its {len(grids)} images' grids "
                         f"{grids} make {sum(counts)}")
    advance = (~is_image).long()  # a text token moves the position on by one, an image by max(h, w)/m at its end
    if grids:
        image_index = is_image.nonzero().squeeze(1)
        ends = image_index[torch.tensor(counts).cumsum(0) - 1]
        advance[ends] = torch.tensor([max(g[1], g[2]) // merge for g in grids])
    start = advance.cumsum(0) - advance  # where each token's block starts (an image's tokens share their start)
    positions = start.unsqueeze(0).repeat(3, 1)
    if grids:
        offsets = torch.cat([_grid_offsets(g, merge) for g in grids], dim=1)
        positions[:, is_image] += offsets
    return positions


def batch_position_ids(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                       image_grids: list[torch.Tensor | None], image_token_id: int, merge: int) -> torch.Tensor:
    """position_ids [B, 4, T] of a (left-padded) batch: text positions and M-RoPE axes of each row's real tokens,
    zeros at padding; `image_grids[i]` is row i's image_grid_thw (None: no image)."""
    batch, width = input_ids.shape
    out = torch.zeros((batch, POSITION_ROWS, width), dtype=torch.long)
    mask = attention_mask.bool()
    out[:, TEXT_AXIS] = (mask.long().cumsum(-1) - 1).clamp(min=0) * mask
    for row in range(batch):
        real = mask[row]
        out[row, MROPE_AXES, real] = row_mrope_positions(input_ids[row, real], image_grids[row], image_token_id,
                                                         merge)
    return out
