"""Greedy validation of the SFT model: batched generation on held-out prompts, scored by the strict "#### n" rule.

Each rank scores its own share of the rows (r, r + world, ...); the counts are summed over ranks.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist


def score_response(data_source: str, response: str, ground_truth: str) -> float:
    """The one place validation scores a response: the reward function training uses for that data source."""
    from verlx.reward.scores import default_compute_score

    score = default_compute_score(data_source, response, ground_truth)
    return float(score["score"] if isinstance(score, dict) else score)


def _left_pad(prompts: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = p
        mask[row, width - len(p) :] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


@torch.no_grad()
def greedy_accuracy(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    ground_truths: list[str],
    data_sources: list[str],
    *,
    eos_ids: list[int],
    pad_id: int,
    batch_size: int,
    max_new_tokens: int,
    device: torch.device,
    rank: int = 0,
    world_size: int = 1,
    num_examples: int = 3,
) -> tuple[dict[str, float], list[tuple[str, str, str]]]:
    """Accuracy over all rows (summed over ranks) and a few (prompt, response, ground truth) examples of this rank."""
    model.eval()
    mine = list(range(rank, len(prompt_ids), world_size))
    correct = 0.0
    examples: list[tuple[str, str, str]] = []
    for start in range(0, len(mine), batch_size):
        rows = mine[start : start + batch_size]
        ids, mask = _left_pad([prompt_ids[r] for r in rows], pad_id)
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos_ids,
            pad_token_id=pad_id,
        )
        responses = tokenizer.batch_decode(out[:, ids.shape[1] :].cpu(), skip_special_tokens=True)
        for row, response in zip(rows, responses):
            correct += score_response(data_sources[row], response, ground_truths[row])
            if len(examples) < num_examples:
                examples.append((tokenizer.decode(prompt_ids[row]), response, str(ground_truths[row])))
    counts = torch.tensor([correct, float(len(mine))], dtype=torch.float64)
    if world_size > 1:
        dist.all_reduce(counts)
    correct_all, total = counts.tolist()
    return {"val/accuracy": correct_all / max(total, 1.0), "val/num_samples": total}, examples
