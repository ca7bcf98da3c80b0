"""The PPO actor: log-probs of responses and the clipped policy update, independent of the sharding backend."""

from __future__ import annotations

import torch

from verlx.algorithms.core import agg_loss
from verlx.algorithms.kl import kl_needs_full_distribution, kl_penalty
from verlx.algorithms.policy_losses import POLICY_LOSSES
from verlx.protocol import DataProto
from verlx.workers.guarded_step import GuardedStepper
from verlx.workers.micro_batching import epoch_order, gradient_accumulation, micro_batches, restore_order
from verlx.workers.stats import MetricAccumulator, global_counts

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids")


class PPOActor:
    """Runs on one data-parallel rank; gradients are averaged across ranks by the sharding backend."""

    def __init__(self, config, module, optimizer=None, device=torch.device("cpu"), max_consecutive_nonfinite: int = 3,
                 reference: "PPOActor | None" = None, adapters_disabled: bool = False):
        self.config = config
        self.module = module
        # a LoRA actor's module doubles as the reference: the same weights with the adapters switched off
        self.adapters_disabled = adapters_disabled
        self.reference = reference  # the frozen reference, for the exact (full-vocabulary) KL
        self.optimizer = optimizer
        self.device = device
        self.stepper = GuardedStepper("actor", max_consecutive_nonfinite)

    # ------------------------------------------------------------------ forward
    def _forward(self, mb: DataProto, temperature: float, with_entropy: bool, **extra):
        if self.adapters_disabled:
            with self.module.hf_model.disable_adapter():
                return self._run_module(mb, temperature, with_entropy, **extra)
        return self._run_module(mb, temperature, with_entropy, **extra)

    def _run_module(self, mb: DataProto, temperature: float, with_entropy: bool, **extra):
        inputs = {k: mb.batch[k].to(self.device, non_blocking=True) for k in MODEL_INPUTS}
        response_length = mb.batch["responses"].shape[-1]
        return self.module(
            **inputs,
            response_length=response_length,
            temperature=temperature,
            chunk_size=self.config.logprob_chunk_size,
            with_entropy=with_entropy,
            **extra,
        )

    @torch.no_grad()
    def response_hidden(self, mb: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """This model's response hidden states and output weight: the other side of an exact KL."""
        self.module.eval()
        return self._forward(mb, 1.0, False, return_response_hidden=True)

    @torch.no_grad()
    def compute_full_kl(self, data: DataProto, micro_batch_size: int | None) -> torch.Tensor:
        """Exact KL(this policy ‖ reference) per response token over the whole vocabulary, [B, R]."""
        temperature = data.meta_info.get("temperature", 1.0)
        self.module.eval()
        parts = []
        for mb in data.split(micro_batch_size or len(data)):
            _, _, full_kl = self._forward(mb, temperature, False, kl_reference=self.reference.response_hidden(mb))
            parts.append(full_kl)
        return torch.cat(parts)

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, micro_batch_size: int | None, use_dynamic_bsz: bool, max_token_len: int,
        calculate_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        temperature = data.meta_info.get("temperature", 1.0)
        self.module.eval()
        parts, order = micro_batches(data, micro_batch_size, use_dynamic_bsz, max_token_len,
                                     key="log_prob_max_token_len_per_gpu")
        log_probs, entropies = [], []
        for mb in parts:
            lp, ent = self._forward(mb, temperature, calculate_entropy)
            log_probs.append(lp)
            if calculate_entropy:
                entropies.append(ent)
        log_prob = torch.cat(log_probs)
        entropy = torch.cat(entropies) if calculate_entropy else None
        if order is not None:
            log_prob = restore_order(log_prob, order.to(log_prob.device))
            entropy = restore_order(entropy, order.to(entropy.device)) if entropy is not None else None
        return log_prob, entropy

    # ------------------------------------------------------------------ update
    def update_policy(self, data: DataProto, mini_batch_size: int, micro_batch_size: int | None) -> dict[str, float]:
        """PPO epochs over mini-batches of `mini_batch_size` samples (this rank's share); one step per mini-batch."""
        cfg = self.config
        temperature = data.meta_info.get("temperature", 1.0)
        use_kl = cfg.use_kl_loss
        keys = [*MODEL_INPUTS, "responses", "response_mask", "old_log_probs", "advantages"]
        if use_kl:
            keys.append("ref_log_prob")
        data = data.select(batch_keys=keys, non_tensor_batch_keys=[], meta_info_keys=[])
        metrics = MetricAccumulator(self.device)
        loss_fn = POLICY_LOSSES.get(cfg.policy_loss.loss_mode)
        self.module.train()
        for epoch in range(cfg.ppo_epochs):
            for mini in epoch_order(data, cfg, epoch).split(mini_batch_size):
                counts = global_counts(mini.batch["response_mask"], self.device)
                parts, _ = micro_batches(mini, micro_batch_size, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu,
                                         key="actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
                self.optimizer.zero_grad(set_to_none=True)
                for mb in gradient_accumulation(self.module, parts, cfg.fsdp_config.defer_grad_reduce):
                    self._micro_step(mb, loss_fn, counts, temperature, metrics)
                self.stepper.step(self.module, self.optimizer, self.config.grad_clip, metrics)
        self.optimizer.zero_grad(set_to_none=True)  # gradients are dead weight until the next update (rollout)
        return metrics.reduce()

    def _micro_step(self, mb: DataProto, loss_fn, counts: dict, temperature: float, metrics: MetricAccumulator):
        with_entropy = self.config.entropy_coeff != 0
        full_kl = None
        if self.config.use_kl_loss and kl_needs_full_distribution(self.config.kl_loss_type):
            log_prob, entropy, full_kl = self._forward(mb, temperature, with_entropy,
                                                       kl_reference=self.reference.response_hidden(mb))
        else:
            log_prob, entropy = self._forward(mb, temperature, with_entropy)
        loss = compose_policy_loss(self.config, loss_fn, mb, log_prob, entropy, counts, metrics, full_kl)
        loss.backward()


def compose_policy_loss(cfg, loss_fn, mb: DataProto, log_prob: torch.Tensor, entropy: torch.Tensor | None,
                        counts: dict, metrics: MetricAccumulator, full_kl: torch.Tensor | None = None) -> torch.Tensor:
    """One micro-batch's share of the mini-batch loss: policy loss − entropy bonus + KL loss; records metrics.

    Shared by every backend (FSDP calls backward on it, megatron's pipeline schedule does). `counts` are the
    mini-batch's global_counts, so the micro losses sum to the mini-batch loss.
    """
    device = log_prob.device
    mask = mb.batch["response_mask"].to(device)
    agg = dict(num_tokens=counts["num_tokens"], num_seqs=counts["num_seqs"])
    old = mb.batch["old_log_probs"].to(device)
    adv = mb.batch["advantages"].to(device)
    pg_loss, pg_metrics = loss_fn(old, log_prob, adv, mask, cfg.loss_agg_mode, cfg, **agg)
    loss = pg_loss
    if cfg.entropy_coeff != 0:
        entropy_loss = agg_loss(entropy, mask, cfg.loss_agg_mode, **agg)
        loss = loss - cfg.entropy_coeff * entropy_loss
        metrics.add_sum("actor/entropy_loss", entropy_loss.detach())
    if cfg.use_kl_loss:
        ref = mb.batch["ref_log_prob"].to(device)
        kl = kl_penalty(log_prob, ref, cfg.kl_loss_type, full_kl=full_kl)
        kl_loss = agg_loss(kl, mask, cfg.loss_agg_mode, **agg)
        loss = loss + cfg.kl_loss_coef * kl_loss
        metrics.add_sum("actor/kl_loss", kl_loss.detach())
        metrics.set("actor/kl_coef", cfg.kl_loss_coef)
    # the micro losses are shares of the mini-batch loss: summing them gives the mini-batch value
    metrics.add_sum("actor/pg_loss", pg_loss.detach())
    share = mask.sum() / counts["rank_tokens"]
    for name, value in pg_metrics.items():
        metrics.add_sum(f"actor/{name}", value.detach() * share)
    return loss
