"""The PPO actor: log-probs of responses and the clipped policy update, on any training engine."""

from __future__ import annotations

import torch
import torch.distributed as dist

from verlx.algorithms.core import agg_loss, masked_mean
from verlx.algorithms.distillation import distillation_inputs, distillation_loss, uses_teacher_topk
from verlx.algorithms.kl import kl_needs_full_distribution, kl_penalty
from verlx.algorithms.policy_losses import select_policy_loss
from verlx.batch_columns import MODEL_INPUTS, TEACHER_LOG_PROB, TEACHER_TOPK_LOG_PROBS, non_tensor_inputs
from verlx.metrics.accumulator import MetricAccumulator
from verlx.protocol import DataProto
from verlx.utils.batch_sizes import sequence_split_size
from verlx.workers.engine import Head, TrainingEngine
from verlx.workers.micro_batching import micro_batches, ppo_mini_batches, restore_order


def collect(outputs: list[dict], name: str, order: torch.Tensor | None) -> torch.Tensor:
    """One head output of every micro-batch, concatenated and put back in the batch's order."""
    values = torch.cat([o[name] for o in outputs])
    return restore_order(values, order.to(values.device)) if order is not None else values


class PPOActor:
    """The policy's phases on one data-parallel rank; the engine averages gradients across ranks.

    `reference` is the frozen reference (an actor whose engine has no optimizer), for the exact KL.
    `rollout_correction` (algorithm.rollout_correction) matters in bypass mode, which replaces the policy loss;
    `dp_size` is the number of data-parallel shards (None: the world size), for loss_agg_mode token-sum.
    `distillation` (distillation.distillation_loss, when distillation.enabled) adds the distillation loss against
    the batch's teacher_log_prob to the update."""

    def __init__(self, config, engine: TrainingEngine, reference: PPOActor | None = None, rollout_correction=None,
                 dp_size: int | None = None, distillation=None):
        self.config = config
        self.engine = engine
        self.reference = reference
        self.rollout_correction = rollout_correction
        self.dp_size = dp_size
        self.distillation = distillation

    @property
    def bypass_mode(self) -> bool:
        """old_log_probs are the rollout engine's (algorithm.rollout_correction.bypass_mode)."""
        return self.rollout_correction is not None and self.rollout_correction.bypass_mode

    def _head(self, temperature: float, with_entropy: bool, full_kl: bool = False,
              sum_pi_squared: bool = False, distillation=None) -> Head:
        kl_reference = self.reference.response_hidden if full_kl else None
        topk = distillation is not None and uses_teacher_topk(distillation)
        return Head("log_probs", temperature, with_entropy, self.config.logprob_chunk_size, kl_reference,
                    sum_pi_squared, with_teacher_topk=topk,
                    topk_min_clamp=distillation.log_prob_min_clamp if topk else None)

    # ------------------------------------------------------------------ forward
    @torch.no_grad()
    def response_hidden(self, mb: DataProto) -> tuple[torch.Tensor, torch.Tensor]:
        """This model's response hidden states and output weight: the other side of an exact KL."""
        return self.engine.forward([mb], Head("response_hidden"))[0]["response_hidden"]

    @torch.no_grad()
    def compute_full_kl(self, data: DataProto, micro_batch_size: int | None) -> torch.Tensor:
        """Exact KL(this policy ‖ reference) per response token over the whole vocabulary, [B, R]."""
        head = self._head(data.meta_info.get("temperature", 1.0), False, full_kl=True)
        return collect(self.engine.forward(data.split(micro_batch_size or len(data)), head), "full_kl", None)

    @torch.no_grad()
    def compute_log_prob(
        self, data: DataProto, micro_batch_size: int | None, use_dynamic_bsz: bool, max_token_len: int,
        calculate_entropy: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        out = self.log_prob_outputs(data, micro_batch_size, use_dynamic_bsz, max_token_len, calculate_entropy)
        return out["log_prob"], out.get("entropy")

    @torch.no_grad()
    def log_prob_outputs(
        self, data: DataProto, micro_batch_size: int | None, use_dynamic_bsz: bool, max_token_len: int,
        calculate_entropy: bool = False, calculate_sum_pi_squared: bool = False,
    ) -> dict[str, torch.Tensor]:
        """{"log_prob"} [B, R], plus "entropy" and "sum_pi_squared" (sum_v pi_v^2) when asked, in data's order;
        `max_token_len` is the per-GPU budget (veRL's: × the sequence-parallel size per micro-batch)."""
        parts, order = micro_batches(data, micro_batch_size, use_dynamic_bsz, max_token_len,
                                     key="log_prob_max_token_len_per_gpu", split=sequence_split_size(self.config))
        head = self._head(data.meta_info.get("temperature", 1.0), calculate_entropy,
                          sum_pi_squared=calculate_sum_pi_squared)
        names = ["log_prob", *(["entropy"] if calculate_entropy else []),
                 *(["sum_pi_squared"] if calculate_sum_pi_squared else [])]
        outputs = self.engine.forward(parts, head)
        if outputs is None:  # a rank that returns nothing; the shape keeps DataProto consistent
            return {name: torch.zeros(data.batch["responses"].shape) for name in names}
        return {name: collect(outputs, name, order) for name in names}

    @torch.no_grad()
    def topk_log_probs(self, data: DataProto, micro_batch_size: int | None, use_dynamic_bsz: bool,
                       max_token_len: int, k: int) -> dict[str, torch.Tensor]:
        """{"topk_ids", "topk_log_probs"} [B, R, k]: this model's k likeliest next tokens at each response position
        and their log-probs (a distillation teacher's, for loss_mode=forward_kl_topk), in data's order."""
        parts, order = micro_batches(data, micro_batch_size, use_dynamic_bsz, max_token_len,
                                     key="log_prob_max_token_len_per_gpu", split=sequence_split_size(self.config))
        head = Head("log_probs", data.meta_info.get("temperature", 1.0), False, self.config.logprob_chunk_size,
                    topk=k)
        outputs = self.engine.forward(parts, head)
        if outputs is None:  # a rank that returns nothing; the shape keeps DataProto consistent
            shape = (*data.batch["responses"].shape, k)
            return {"topk_ids": torch.zeros(shape, dtype=torch.long), "topk_log_probs": torch.zeros(shape)}
        return {name: collect(outputs, name, order) for name in ("topk_ids", "topk_log_probs")}

    # ------------------------------------------------------------------ update
    def update_policy(self, data: DataProto, mini_batch_size: int, micro_batch_size: int | None) -> dict[str, float]:
        """PPO epochs over mini-batches of `mini_batch_size` samples (this rank's share); one step per mini-batch.

        With `rollout_is_weights` in `data` (rollout correction) each token's policy-gradient loss is weighted.
        The first mini-batch of the first epoch is probed (OnPolicyProbe): it runs with the weights old_log_probs
        were computed with, so its log-probs must reproduce them (not in bypass mode: there old_log_probs are the
        rollout engine's)."""
        cfg = self.config
        keys = [*MODEL_INPUTS, "responses", "response_mask", "old_log_probs", "advantages"]
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        if "rollout_is_weights" in data.batch:
            keys.append("rollout_is_weights")
        if self.distillation is not None:
            keys += distillation_inputs(self.distillation)
        head = self._head(data.meta_info.get("temperature", 1.0), cfg.entropy_coeff != 0,
                          full_kl=cfg.use_kl_loss and kl_needs_full_distribution(cfg.kl_loss_type),
                          distillation=self.distillation)
        data = data.select(batch_keys=keys, non_tensor_batch_keys=non_tensor_inputs(data.non_tensor_batch),
                           meta_info_keys=[])
        metrics = MetricAccumulator(self.engine.device)
        loss_fn = select_policy_loss(cfg, self.rollout_correction)
        probe = OnPolicyProbe(self.engine.device, enabled=not self.bypass_mode)

        def micro_loss(mb: DataProto, out: dict, counts: dict) -> torch.Tensor:
            probe.observe(mb, out["log_prob"])
            if self.distillation is not None:
                return compose_distillation_loss(cfg, self.distillation, loss_fn, mb, out, counts, metrics)
            return compose_policy_loss(cfg, loss_fn, mb, out["log_prob"], out["entropy"], counts, metrics,
                                       out.get("full_kl"))

        mini_batches = ppo_mini_batches(data, cfg, mini_batch_size, micro_batch_size, self.engine.device,
                                        key="actor_rollout_ref.actor", dp_size=self.dp_size)
        result = self.engine.update(probe.first_only(mini_batches), head, micro_loss, metrics)
        result.update(probe.reduce())
        return result


class OnPolicyProbe:
    """Log-probs of the update's first mini-batch (first PPO epoch) against old_log_probs, before any optimizer
    step: the same weights, so with the same kernels and no train-mode randomness (dropout) they are equal.
    `reduce` (collective: every rank of the world calls it) returns actor/on_policy_log_prob_diff_max (max |Δ| over
    the mini-batch's response tokens, all ranks) and actor/ppo_kl_first_mini_batch (mean of old − new there);
    nothing when not `enabled`."""

    def __init__(self, device: torch.device, enabled: bool = True):
        self.enabled = enabled
        self.active = enabled
        self.stats = torch.zeros(3, dtype=torch.float64, device=device)  # max |diff|, sum(old - new), tokens

    def first_only(self, mini_batches):
        for mini in mini_batches:
            yield mini
            self.active = False

    def observe(self, mb: DataProto, log_prob: torch.Tensor) -> None:
        if not self.active:
            return
        mask = mb.batch["response_mask"].to(log_prob.device).bool()
        diff = mb.batch["old_log_probs"].to(log_prob.device).double() - log_prob.detach().double()
        diff = torch.where(mask, diff, torch.zeros_like(diff))
        self.stats[0] = torch.maximum(self.stats[0], diff.abs().max() if diff.numel() else self.stats[0])
        self.stats[1] += diff.sum()
        self.stats[2] += mask.sum()

    def reduce(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        peak, sums = self.stats[:1].clone(), self.stats[1:].clone()
        if dist.is_initialized():
            dist.all_reduce(peak, op=dist.ReduceOp.MAX)
            dist.all_reduce(sums)
        peak_value, total, tokens = torch.cat([peak, sums]).tolist()  # one host read per update
        return {"actor/on_policy_log_prob_diff_max": peak_value,
                "actor/ppo_kl_first_mini_batch": total / max(tokens, 1.0)}


def compose_policy_loss(cfg, loss_fn, mb: DataProto, log_prob: torch.Tensor, entropy: torch.Tensor | None,
                        counts: dict, metrics: MetricAccumulator, full_kl: torch.Tensor | None = None) -> torch.Tensor:
    """One micro-batch's share of the mini-batch loss: policy loss − entropy bonus + KL loss; records metrics.

    `counts` are the mini-batch's global_counts, so the micro losses sum to the mini-batch loss.
    """
    device = log_prob.device
    mask = mb.batch["response_mask"].to(device)
    agg = _agg_counts(cfg, counts)
    old = mb.batch["old_log_probs"].to(device)
    adv = mb.batch["advantages"].to(device)
    weights = mb.batch.get("rollout_is_weights")
    pg_agg = agg if weights is None else dict(agg, weights=weights.to(device))
    pg_loss, pg_metrics = loss_fn(old, log_prob, adv, mask, cfg.loss_agg_mode, cfg, **pg_agg)
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
    for name, value in pg_metrics.items():  # names with a section (bypass mode's rollout_corr/...) keep it
        metrics.add_sum(name if "/" in name else f"actor/{name}", value.detach() * share)
    return loss


def _agg_counts(cfg, counts: dict) -> dict:
    return dict(num_tokens=counts["num_tokens"], num_seqs=counts["num_seqs"], dp_size=counts["dp_size"],
                norm_length=cfg.loss_scale_factor)


def compose_distillation_loss(cfg, distill, loss_fn, mb: DataProto, out: dict, counts: dict,
                              metrics: MetricAccumulator) -> torch.Tensor:
    """veRL's distillation_ppo_loss for one micro-batch: distillation loss × distillation_loss_coef (1 without
    use_task_rewards) plus the policy loss (compose_policy_loss) when use_task_rewards; the policy loss is still
    computed for its metrics with use_policy_gradient alone, as veRL does, and not at all with neither."""
    log_prob = out["log_prob"]
    device = log_prob.device
    mask = mb.batch["response_mask"].to(device)
    weights = mb.batch.get("rollout_is_weights")
    share = mask.sum() / counts["rank_tokens"]
    if uses_teacher_topk(distill):
        losses = out["topk_kl"]
        metrics.add_sum("distillation/student_mass", masked_mean(out["topk_student_mass"], mask).detach() * share)
        teacher_mass = mb.batch[TEACHER_TOPK_LOG_PROBS].to(device).exp().sum(-1)
        metrics.add_sum("distillation/teacher_mass", masked_mean(teacher_mass, mask) * share)
    else:
        losses = kl_penalty(log_prob, mb.batch[TEACHER_LOG_PROB].to(device), distill.loss_mode)
    result = distillation_loss(distill, losses, log_prob, mb.batch["old_log_probs"].to(device), mask,
                               cfg.loss_agg_mode, weights=None if weights is None else weights.to(device),
                               **_agg_counts(cfg, counts))
    metrics.add_min("distillation/loss_min", result.loss_min)
    metrics.add_max("distillation/loss_max", result.loss_max)
    for name, value in result.means.items():
        metrics.add_sum(name, value * share)
    metrics.add_sum("distillation/loss", result.loss.detach())
    loss = result.loss * (distill.distillation_loss_coef if distill.use_task_rewards else 1.0)
    if distill.use_task_rewards or distill.use_policy_gradient:
        policy_loss = compose_policy_loss(cfg, loss_fn, mb, log_prob, out["entropy"], counts, metrics,
                                          out.get("full_kl"))
        if distill.use_task_rewards:
            loss = loss + policy_loss
    return loss
