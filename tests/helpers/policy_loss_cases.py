"""Hand-worked policy-loss cases: tensors from rows and ratios, and one loss evaluation with its gradient."""

from __future__ import annotations

import torch

from verlx.algorithms.policy_losses import POLICY_LOSSES


def inputs(log_prob, ratio, advantages, mask):
    """[B, R] tensors from rows (one flat list = one row): current log-probs (a leaf that records gradients) and
    old log-probs chosen so that pi / pi_old = ratio."""
    def tensor(values):
        return torch.tensor(values if isinstance(values[0], list) else [values], dtype=torch.float64)

    log_prob = tensor(log_prob).requires_grad_(True)
    old = log_prob.detach() - torch.log(tensor(ratio))
    return old, log_prob, tensor(advantages), tensor(mask)


def run(mode, old, log_prob, advantages, mask, config, agg="token-mean", **agg_kwargs):
    loss, metrics = POLICY_LOSSES.get(mode)(old, log_prob, advantages, mask, agg, config, **agg_kwargs)
    loss.backward()
    grad = log_prob.grad.tolist()
    return loss.item(), {k: v.item() for k, v in metrics.items()}, grad[0] if len(grad) == 1 else grad
