"""The PPO critic: values of response positions and the clipped value update, independent of the backend."""

from __future__ import annotations

import torch

from verlx.algorithms.core import compute_value_loss
from verlx.protocol import DataProto
from verlx.workers.actor import MODEL_INPUTS
from verlx.workers.guarded_step import GuardedStepper
from verlx.workers.micro_batching import epoch_order, gradient_accumulation, micro_batches, restore_order
from verlx.workers.stats import MetricAccumulator, global_counts


class PPOCritic:
    def __init__(self, config, module, optimizer=None, device=torch.device("cpu"), max_consecutive_nonfinite: int = 3):
        self.config = config
        self.module = module
        self.optimizer = optimizer
        self.device = device
        self.stepper = GuardedStepper("critic", max_consecutive_nonfinite)

    def _forward(self, mb: DataProto) -> torch.Tensor:
        inputs = {k: mb.batch[k].to(self.device, non_blocking=True) for k in MODEL_INPUTS}
        values = self.module(**inputs, response_length=mb.batch["responses"].shape[-1])
        return values * mb.batch["response_mask"].to(self.device)

    @torch.no_grad()
    def compute_values(self, data: DataProto, micro_batch_size: int | None) -> torch.Tensor:
        cfg = self.config
        self.module.eval()
        parts, order = micro_batches(data, micro_batch_size, cfg.use_dynamic_bsz, cfg.forward_max_token_len_per_gpu,
                                     key="critic.forward_max_token_len_per_gpu")
        values = torch.cat([self._forward(mb) for mb in parts])
        return restore_order(values, order.to(values.device)) if order is not None else values

    def update_critic(self, data: DataProto, mini_batch_size: int, micro_batch_size: int | None) -> dict[str, float]:
        cfg = self.config
        data = data.select(batch_keys=[*MODEL_INPUTS, "responses", "response_mask", "values", "returns"],
                           non_tensor_batch_keys=[], meta_info_keys=[])
        metrics = MetricAccumulator(self.device)
        self.module.train()
        for epoch in range(cfg.ppo_epochs):
            for mini in epoch_order(data, cfg, epoch).split(mini_batch_size):
                counts = global_counts(mini.batch["response_mask"], self.device)
                parts, _ = micro_batches(mini, micro_batch_size, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu,
                                         key="critic.ppo_max_token_len_per_gpu")
                self.optimizer.zero_grad(set_to_none=True)
                for mb in gradient_accumulation(self.module, parts, cfg.model.fsdp_config.defer_grad_reduce):
                    compose_value_loss(cfg, mb, self._forward(mb), counts, metrics).backward()
                self.stepper.step(self.module, self.optimizer, self.config.grad_clip, metrics)
        self.optimizer.zero_grad(set_to_none=True)  # gradients are dead weight until the next update
        return metrics.reduce()


def compose_value_loss(cfg, mb: DataProto, vpreds: torch.Tensor, counts: dict, metrics: MetricAccumulator):
    """One micro-batch's share of the clipped value loss (shared by every backend); records metrics."""
    device = vpreds.device
    mask = mb.batch["response_mask"].to(device)
    vf_loss, clipfrac = compute_value_loss(
        vpreds, mb.batch["returns"].to(device), mb.batch["values"].to(device), mask,
        cfg.cliprange_value, cfg.loss_agg_mode, num_tokens=counts["num_tokens"], num_seqs=counts["num_seqs"],
    )
    share = mask.sum() / counts["rank_tokens"]
    metrics.add_sum("critic/vf_loss", vf_loss.detach())
    metrics.add_sum("critic/vf_clipfrac", clipfrac.detach() * share)
    metrics.add_sum("critic/vpred_mean", (vpreds.detach() * mask).sum() / counts["rank_tokens"])
    return vf_loss
