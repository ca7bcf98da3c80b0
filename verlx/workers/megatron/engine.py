"""Running PPO phases through megatron's pipeline schedules: log-probs, values, and updates with a guarded step.

The loss of every micro-batch is composed by the backend-independent code (actor.compose_policy_loss,
critic.compose_value_loss) with global token counts; megatron divides a returned loss by the number of
micro-batches, so we hand it the loss times that number. Gradients are averaged over data-parallel ranks by
megatron's DDP, the same contract as FSDP.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
from megatron.core import parallel_state as mpu
from megatron.core.pipeline_parallel import get_forward_backward_func

from verlx.algorithms.policy_losses import POLICY_LOSSES
from verlx.protocol import DataProto
from verlx.workers.actor import MODEL_INPUTS, compose_policy_loss
from verlx.workers.critic import compose_value_loss
from verlx.workers.guarded_step import NonFiniteUpdates
from verlx.workers.megatron.batch_layout import AlignedBatch, align_batch
from verlx.workers.micro_batching import epoch_order, micro_batches, restore_order
from verlx.workers.stats import MetricAccumulator, global_counts


@dataclass
class MicroBatch:
    data: DataProto  # the rows (on CPU) for the loss
    aligned: AlignedBatch  # model inputs on the device


def _unwrap(model):
    return getattr(model, "module", model)


class MegatronRunner:
    """This rank's model chunks (DDP-wrapped when trainable) and the schedule that runs them."""

    def __init__(self, chunks: list, device: torch.device, optimizer=None, role: str = "actor",
                 max_consecutive_nonfinite: int = 3):
        self.chunks = chunks
        self.device = device
        self.optimizer = optimizer
        self.role = role
        self.max_consecutive = max_consecutive_nonfinite
        self.consecutive = 0
        self.config = _unwrap(chunks[0]).config
        self.seq_multiple = mpu.get_tensor_model_parallel_world_size() if self.config.sequence_parallel else 1

    @property
    def is_last_stage(self) -> bool:
        return mpu.is_pipeline_last_stage(ignore_virtual=True)

    def prepare(self, parts: list[DataProto]) -> list[MicroBatch]:
        out = []
        for mb in parts:
            aligned = align_batch(mb.batch["input_ids"], mb.batch["attention_mask"], mb.batch["responses"].shape[-1],
                                  self.seq_multiple)
            out.append(MicroBatch(mb, aligned.to(self.device)))
        return out

    def run(self, micro: list[MicroBatch], loss_func, forward_only: bool) -> list:
        """One pass of the schedule over `micro`; on the last stage the list of what loss_func returned."""
        pp = mpu.get_pipeline_model_parallel_world_size()
        if len(self.chunks) > 1 and len(micro) % pp:
            raise ValueError(f"the interleaved pipeline schedule needs a multiple of pipeline_model_parallel_size="
                             f"{pp} micro-batches, got {len(micro)}; change the micro-batch size")

        def forward_step(data_iterator, model):
            item = next(data_iterator)
            hidden = model(item.aligned.input_ids)
            return hidden, functools.partial(loss_func, item, _unwrap(model))

        iterators = [iter(micro) for _ in self.chunks]
        for chunk in self.chunks:
            chunk.train(not forward_only)
        return get_forward_backward_func()(
            forward_step_func=forward_step,
            data_iterator=iterators if len(self.chunks) > 1 else iterators[0],
            model=self.chunks if len(self.chunks) > 1 else self.chunks[0],
            num_microbatches=len(micro),
            seq_length=max(m.aligned.input_ids.shape[1] for m in micro),
            micro_batch_size=max(len(m.data) for m in micro),
            forward_only=forward_only,
        )

    # ------------------------------------------------------------------ optimizer step
    def zero_grad(self) -> None:
        for chunk in self.chunks:
            chunk.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _grads_finite(self) -> bool:
        """One flag for every rank: a non-finite gradient anywhere skips the step everywhere (one host sync)."""
        sums = [buf.grad_data.float().sum() for chunk in self.chunks for buf in getattr(chunk, "buffers", [])]
        local = torch.stack(sums).sum() if sums else torch.zeros((), device=self.device)
        bad = (~torch.isfinite(local)).float().reshape(1)
        if dist.is_initialized():
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return bad.item() == 0

    def step(self, metrics: MetricAccumulator) -> None:
        if self._grads_finite():
            ok, grad_norm, _ = self.optimizer.step()
            self.consecutive = 0
            if grad_norm is not None:
                metrics.add_mean(f"{self.role}/grad_norm", torch.tensor(float(grad_norm)))
        else:
            self.zero_grad()
            self.consecutive += 1
            metrics.add_count(f"{self.role}/nonfinite_updates_skipped")
            if self.consecutive >= self.max_consecutive:
                raise NonFiniteUpdates(
                    f"{self.consecutive} consecutive {self.role} updates had a non-finite gradient; stopping as "
                    "trainer.max_consecutive_nonfinite_updates says"
                )
        metrics.end_step()

    def reduce_metrics(self, metrics: MetricAccumulator) -> dict[str, float]:
        """Metrics live on the last pipeline stage; they are averaged over its data-parallel group."""
        if not self.is_last_stage:
            return {}
        return metrics.reduce(group=mpu.get_data_parallel_group())


class MegatronPPOActor:
    """PPOActor's phases on megatron chunks (a reference model is one without an optimizer)."""

    def __init__(self, config, runner: MegatronRunner):
        self.config = config
        self.runner = runner

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, micro_batch_size: int | None, use_dynamic_bsz: bool,
                         max_token_len: int, calculate_entropy: bool = False):
        temperature = data.meta_info.get("temperature", 1.0)
        parts, order = micro_batches(data, micro_batch_size, use_dynamic_bsz, max_token_len,
                                     key="log_prob_max_token_len_per_gpu")
        micro = self.runner.prepare(parts)
        chunk_size = self.config.logprob_chunk_size

        def loss_func(item, chunk, hidden):
            lp, ent = chunk.log_probs(hidden, item.aligned, temperature, chunk_size, calculate_entropy)
            return torch.zeros((), device=hidden.device), {"log_prob": lp, "entropy": ent}

        outputs = self.runner.run(micro, loss_func, forward_only=True)
        shape = data.batch["responses"].shape
        if not self.runner.is_last_stage:  # not collected; the shape keeps DataProto consistent
            zeros = torch.zeros(shape)
            return zeros, (zeros if calculate_entropy else None)
        log_prob = torch.cat([o["log_prob"] for o in outputs])
        entropy = torch.cat([o["entropy"] for o in outputs]) if calculate_entropy else None
        if order is not None:
            log_prob = restore_order(log_prob, order.to(log_prob.device))
            entropy = restore_order(entropy, order.to(entropy.device)) if entropy is not None else None
        return log_prob, entropy

    def update_policy(self, data: DataProto, mini_batch_size: int, micro_batch_size: int | None) -> dict[str, float]:
        cfg = self.config
        temperature = data.meta_info.get("temperature", 1.0)
        keys = [*MODEL_INPUTS, "responses", "response_mask", "old_log_probs", "advantages"]
        if cfg.use_kl_loss:
            keys.append("ref_log_prob")
        data = data.select(batch_keys=keys, non_tensor_batch_keys=[], meta_info_keys=[])
        metrics = MetricAccumulator(self.runner.device)
        loss_fn = POLICY_LOSSES.get(cfg.policy_loss.loss_mode)
        with_entropy = cfg.entropy_coeff != 0
        for epoch in range(cfg.ppo_epochs):
            for mini in epoch_order(data, cfg, epoch).split(mini_batch_size):
                counts = global_counts(mini.batch["response_mask"], self.runner.device)
                parts, _ = micro_batches(mini, micro_batch_size, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu,
                                         key="actor_rollout_ref.actor.ppo_max_token_len_per_gpu")
                micro = self.runner.prepare(parts)
                n_micro = len(micro)

                def loss_func(item, chunk, hidden):
                    lp, ent = chunk.log_probs(hidden, item.aligned, temperature, cfg.logprob_chunk_size,
                                              with_entropy)
                    loss = compose_policy_loss(cfg, loss_fn, item.data, lp, ent, counts, metrics)
                    return loss * n_micro, {}

                self.runner.zero_grad()
                self.runner.run(micro, loss_func, forward_only=False)
                self.runner.step(metrics)
        return self.runner.reduce_metrics(metrics)


class MegatronPPOCritic:
    def __init__(self, config, runner: MegatronRunner):
        self.config = config
        self.runner = runner

    @torch.no_grad()
    def compute_values(self, data: DataProto, micro_batch_size: int | None) -> torch.Tensor:
        cfg = self.config
        parts, order = micro_batches(data, micro_batch_size, cfg.use_dynamic_bsz, cfg.forward_max_token_len_per_gpu,
                                     key="critic.forward_max_token_len_per_gpu")

        def loss_func(item, chunk, hidden):
            return torch.zeros((), device=hidden.device), {"values": chunk.values(hidden, item.aligned)}

        outputs = self.runner.run(self.runner.prepare(parts), loss_func, forward_only=True)
        if not self.runner.is_last_stage:
            return torch.zeros(data.batch["responses"].shape)
        values = torch.cat([o["values"] for o in outputs])
        if order is not None:
            values = restore_order(values, order.to(values.device))
        values = values * data.batch["response_mask"].to(values.device)
        return values

    def update_critic(self, data: DataProto, mini_batch_size: int, micro_batch_size: int | None) -> dict[str, float]:
        cfg = self.config
        data = data.select(batch_keys=[*MODEL_INPUTS, "responses", "response_mask", "values", "returns"],
                           non_tensor_batch_keys=[], meta_info_keys=[])
        metrics = MetricAccumulator(self.runner.device)
        for epoch in range(cfg.ppo_epochs):
            for mini in epoch_order(data, cfg, epoch).split(mini_batch_size):
                counts = global_counts(mini.batch["response_mask"], self.runner.device)
                parts, _ = micro_batches(mini, micro_batch_size, cfg.use_dynamic_bsz, cfg.ppo_max_token_len_per_gpu,
                                         key="critic.ppo_max_token_len_per_gpu")
                micro = self.runner.prepare(parts)
                n_micro = len(micro)

                def loss_func(item, chunk, hidden):
                    mask = item.data.batch["response_mask"].to(hidden.device)
                    vpreds = chunk.values(hidden, item.aligned) * mask
                    return compose_value_loss(cfg, item.data, vpreds, counts, metrics) * n_micro, {}

                self.runner.zero_grad()
                self.runner.run(micro, loss_func, forward_only=False)
                self.runner.step(metrics)
        return self.runner.reduce_metrics(metrics)

