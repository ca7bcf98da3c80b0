"""What the reward model reads and where its scores go, as veRL's reward-model worker does.

With reward_model.model.input_tokenizer set, each response is decoded with that (the policy's) tokenizer, its eos
text removed, appended to the prompt's messages (the batch's `raw_prompt`) as the assistant turn, and the chat is
rendered with the reward model's own template and tokenizer (no special tokens added beyond the template's),
right-padded and cut on the right at reward_model.max_length (null: the batch's prompt + response width). With it
null, the policy's own tokens are scored. A score goes to the last real token of the response (column 0 for an
empty response, so that token_level_scores.sum(-1) is always the sample's reward).
"""

from __future__ import annotations

import numpy as np
import torch

from verlx.protocol import DataProto


def response_mask_of(data: DataProto) -> torch.Tensor:
    width = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -width:].long()


def retemplated_inputs(data: DataProto, input_tokenizer, rm_tokenizer, max_length: int | None) -> DataProto:
    """The reward model's input_ids / attention_mask / position_ids of every row, re-rendered with its template."""
    if "raw_prompt" not in data.non_tensor_batch:
        raise KeyError("the reward model re-renders each chat (reward_model.model.input_tokenizer) and needs the "
                       "prompt's messages, non_tensor_batch['raw_prompt'] (data.return_raw_chat=true)")
    lengths = response_mask_of(data).sum(-1).tolist()
    responses = data.batch["responses"].cpu().numpy()
    texts = input_tokenizer.batch_decode([row[:n].tolist() for row, n in zip(responses, lengths)])
    eos = input_tokenizer.eos_token or ""
    chats = [[*list(prompt), {"role": "assistant", "content": text.replace(eos, "") if eos else text}]
             for prompt, text in zip(data.non_tensor_batch["raw_prompt"], texts)]
    rendered = rm_tokenizer.apply_chat_template(chats, add_generation_prompt=False, tokenize=False)
    ids = rm_tokenizer(rendered, add_special_tokens=False)["input_ids"]
    limit = max_length or data.batch["attention_mask"].shape[-1]
    ids = [row[:limit] for row in ids]
    width = max(len(row) for row in ids)
    input_ids = np.full((len(ids), width), rm_tokenizer.pad_token_id, dtype=np.int64)
    attention_mask = np.zeros((len(ids), width), dtype=np.int64)
    for i, row in enumerate(ids):
        input_ids[i, : len(row)] = row
        attention_mask[i, : len(row)] = 1
    mask = torch.from_numpy(attention_mask)
    return DataProto({"input_ids": torch.from_numpy(input_ids), "attention_mask": mask,
                      "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)})


def scores_at_last_response_token(data: DataProto, scores: torch.Tensor) -> torch.Tensor:
    """[B] scores → [B, R] float32 zeros but each row's last real response token (column 0 when empty)."""
    mask = response_mask_of(data)
    positions = torch.arange(1, mask.shape[-1] + 1)
    last = (mask.cpu() * positions).argmax(-1)
    out = torch.zeros(mask.shape, dtype=torch.float32)
    return out.scatter_(1, last[:, None], scores.float().cpu()[:, None])
