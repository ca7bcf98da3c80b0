"""Per-step data metrics with veRL's names: scores, rewards, advantages, returns, values and lengths.

Everything is computed on the batch's device and read back with one host transfer at the end.
"""

from __future__ import annotations

import torch

from verlx.algorithms.core import masked_mean, masked_var


def _stats(name: str, values: torch.Tensor, mask: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """mean/max/min of values (over the mask when given); NaN when nothing is selected."""
    values = values.float()
    if mask is None:
        mask = torch.ones_like(values, dtype=torch.bool)
    mask = mask.bool()
    empty = ~mask.any()
    nan = torch.full((), float("nan"), device=values.device)
    return {
        f"{name}/mean": torch.where(empty, nan, masked_mean(values, mask)),
        f"{name}/max": torch.where(empty, nan, torch.where(mask, values, -torch.inf).max()),
        f"{name}/min": torch.where(empty, nan, torch.where(mask, values, torch.inf).min()),
    }


def compute_data_metrics(batch, use_critic: bool) -> dict[str, float]:
    """critic/{score,rewards,advantages,returns}/{mean,max,min}, critic/values/* and critic/vf_explained_var with a
    critic, response_length/* and prompt_length/* (with clip_ratio: the share of samples at the maximum length),
    response/aborted_ratio and response_length_non_aborted/*.

    Scores and rewards are per-sample sums of token_level_scores / token_level_rewards over the samples that were
    not aborted; advantages, returns and values are taken over response tokens (response_mask); prompt lengths
    count attention_mask[:, :P] where P is the prompt width (attention_mask width minus the response width). As in
    veRL, a sample is *aborted* when its response has no token at all (attention_mask[:, P:] all zero): the ones
    rollout.over_sample_rate cancelled.
    """
    b = batch.batch
    response_mask = b["response_mask"].bool()
    max_response_length = response_mask.shape[-1]
    prompt_mask = b["attention_mask"][:, : b["attention_mask"].shape[-1] - max_response_length]
    max_prompt_length = prompt_mask.shape[-1]
    response_length = response_mask.sum(-1).float()
    prompt_length = prompt_mask.sum(-1).float()
    kept = b["attention_mask"][:, max_prompt_length:].sum(-1) > 0

    metrics = {
        **_stats("critic/score", b["token_level_scores"].sum(-1), kept),
        **_stats("critic/rewards", b["token_level_rewards"].sum(-1), kept),
        **_stats("critic/advantages", b["advantages"], response_mask),
        **_stats("critic/returns", b["returns"], response_mask),
    }
    if use_critic:
        returns, values = b["returns"].float(), b["values"].float()
        metrics.update(_stats("critic/values", values, response_mask))
        explained = 1.0 - masked_var(returns - values, response_mask) / (masked_var(returns, response_mask) + 1e-5)
        metrics["critic/vf_explained_var"] = explained
    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length == max_response_length).float().mean()
    metrics["response/aborted_ratio"] = (~kept).float().mean()
    metrics.update(_stats("response_length_non_aborted", response_length, kept))
    at_limit = (response_length == max_response_length) & kept
    metrics["response_length_non_aborted/clip_ratio"] = at_limit.float().sum() / kept.sum().clamp(min=1)
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = (prompt_length == max_prompt_length).float().mean()

    names = list(metrics)
    values = torch.stack([metrics[k].detach().float().reshape(()) for k in names]).cpu().tolist()
    return dict(zip(names, values))
