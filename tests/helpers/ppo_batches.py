"""Small PPO batches in the actor's layout: left-padded prompts, right-padded responses of random lengths."""

from __future__ import annotations

import torch

from verlx.protocol import DataProto


def ragged_ppo_batch(seed: int, rows: int = 8, prompt: int = 6, response: int = 5, token_range=(3, 20),
                     critic: bool = False, meta_info: dict | None = None) -> DataProto:
    """Random token ids in `token_range`, old log-probs and advantages (plus values and returns with `critic`),
    all zero outside the response mask; the same seed gives the same batch."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(*token_range, (rows, prompt + response), generator=g)
    p = torch.randint(1, prompt + 1, (rows,), generator=g)
    r = torch.randint(1, response + 1, (rows,), generator=g)
    cols = torch.arange(prompt + response)
    mask = ((cols >= prompt - p[:, None]) & (cols < prompt + r[:, None])).long()
    rmask = mask[:, prompt:]
    tensors = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
               "responses": ids[:, prompt:], "response_mask": rmask,
               "old_log_probs": -torch.rand(rows, response, generator=g) * rmask,
               "advantages": torch.randn(rows, response, generator=g) * rmask}
    if critic:
        tensors["values"] = torch.randn(rows, response, generator=g) * rmask
        tensors["returns"] = torch.randn(rows, response, generator=g) * rmask
    return DataProto(tensors, meta_info=meta_info)
