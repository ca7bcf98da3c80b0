"""The PPO critic: values of response positions and the clipped value update, on any training engine."""

from __future__ import annotations

import torch

from verlx.algorithms.core import compute_value_loss
from verlx.batch_columns import MODEL_INPUTS
from verlx.metrics.accumulator import MetricAccumulator
from verlx.protocol import DataProto
from verlx.utils.batch_sizes import sequence_split_size
from verlx.workers.actor import collect
from verlx.workers.engine import Head, TrainingEngine
from verlx.workers.micro_batching import micro_batches, ppo_mini_batches

VALUES = Head("values")


class PPOCritic:
    """The value model's phases on one data-parallel rank; values are zero outside the response mask. `dp_size`: the
    number of data-parallel shards (None: the world size), for loss_agg_mode token-sum."""

    def __init__(self, config, engine: TrainingEngine, dp_size: int | None = None):
        self.config = config
        self.engine = engine
        self.dp_size = dp_size

    @torch.no_grad()
    def compute_values(self, data: DataProto, micro_batch_size: int | None) -> torch.Tensor:
        cfg = self.config
        parts, order = micro_batches(data, micro_batch_size, cfg.use_dynamic_bsz, cfg.forward_max_token_len_per_gpu,
                                     key="critic.forward_max_token_len_per_gpu", split=sequence_split_size(cfg))
        outputs = self.engine.forward(parts, VALUES)
        if outputs is None:  # a rank that returns nothing; the shape keeps DataProto consistent
            return torch.zeros(data.batch["responses"].shape)
        values = collect(outputs, "values", order)
        return values * data.batch["response_mask"].to(values.device)

    def update_critic(self, data: DataProto, mini_batch_size: int, micro_batch_size: int | None) -> dict[str, float]:
        cfg = self.config
        data = data.select(batch_keys=[*MODEL_INPUTS, "responses", "response_mask", "values", "returns"],
                           non_tensor_batch_keys=[], meta_info_keys=[])
        metrics = MetricAccumulator(self.engine.device)

        def micro_loss(mb: DataProto, out: dict, counts: dict) -> torch.Tensor:
            vpreds = out["values"] * mb.batch["response_mask"].to(out["values"].device)
            return compose_value_loss(cfg, mb, vpreds, counts, metrics)

        mini_batches = ppo_mini_batches(data, cfg, mini_batch_size, micro_batch_size, self.engine.device, key="critic",
                                        dp_size=self.dp_size)
        return self.engine.update(mini_batches, VALUES, micro_loss, metrics)


def compose_value_loss(cfg, mb: DataProto, vpreds: torch.Tensor, counts: dict, metrics: MetricAccumulator):
    """One micro-batch's share of the clipped value loss; records metrics."""
    device = vpreds.device
    mask = mb.batch["response_mask"].to(device)
    vf_loss, clipfrac = compute_value_loss(
        vpreds, mb.batch["returns"].to(device), mb.batch["values"].to(device), mask,
        cfg.cliprange_value, cfg.loss_agg_mode, num_tokens=counts["num_tokens"], num_seqs=counts["num_seqs"],
        dp_size=counts["dp_size"], norm_length=cfg.loss_scale_factor,
    )
    share = mask.sum() / counts["rank_tokens"]
    metrics.add_sum("critic/vf_loss", vf_loss.detach())
    metrics.add_sum("critic/vf_clipfrac", clipfrac.detach() * share)
    metrics.add_sum("critic/vpred_mean", (vpreds.detach() * mask).sum() / counts["rank_tokens"])
    return vf_loss
