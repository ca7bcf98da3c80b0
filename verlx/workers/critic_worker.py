"""CriticWorker: the value model's FSDP shards, for GAE."""

from __future__ import annotations

import time

from verlx.config.schema import PPOConfig
from verlx.models.ulysses import check_ulysses, sequence_parallel_group
from verlx.protocol import DataProto
from verlx.single_controller import Dispatch, Worker, register
from verlx.utils.distributed import init_distributed
from verlx.utils.dtypes import torch_dtype
from verlx.utils.seeding import seed_everything
from verlx.workers.critic import PPOCritic
from verlx.workers.fsdp.checkpoint import FSDPCheckpointManager
from verlx.workers.fsdp.model_builder import (
    apply_fsdp2,
    build_lr_scheduler,
    build_optimizer,
    compile_for_training,
    expand_path,
    load_hf_config,
    load_value_model,
)
from verlx.workers.fsdp.offload import Offloader
from verlx.workers.micro_batching import sequence_lengths
from verlx.workers.perf import PhaseTimer, phase_metrics


class CriticWorker(Worker):
    def __init__(self, config: PPOConfig):
        super().__init__()
        self.config = config

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> None:
        cfg = self.config
        critic = cfg.critic
        init_distributed(timeout_s=cfg.actor_rollout_ref.nccl_timeout)
        seed_everything(cfg.trainer.seed + 1000 + self.rank)
        path = expand_path(critic.model.path or cfg.actor_rollout_ref.model.path)
        fsdp = critic.model.fsdp_config
        sp = critic.ulysses_sequence_parallel_size
        self.hf_config = load_hf_config(path, critic.model.trust_remote_code, critic.model.override_config)
        if sp > 1:
            check_ulysses(self.hf_config, sp, self.world_size, "critic.ulysses_sequence_parallel_size")
        sp_group, dp_rank, dp_size = sequence_parallel_group(sp)
        self.set_dispatch_info("critic", dp_rank, dp_size, self.rank % sp == 0)
        module = load_value_model(path, critic.model, torch_dtype(fsdp.model_dtype), sp_group=sp_group)
        compile_for_training(module, critic.use_torch_compile, self.device)
        apply_fsdp2(module, self.device, torch_dtype(fsdp.dtype), fsdp.reshard_after_forward,
                    cpu_offload=fsdp.offload_policy and self.device.type == "cuda",
                    grad_divide_factor=dp_size if sp_group is not None else None)
        optimizer = build_optimizer(module.parameters(), critic.optim)
        self.lr_scheduler = build_lr_scheduler(optimizer, critic.optim, cfg.trainer.total_training_steps or 1)
        self.critic = PPOCritic(critic, module, optimizer, self.device, cfg.trainer.max_consecutive_nonfinite_updates)
        self.checkpoint = FSDPCheckpointManager(module, optimizer, self.lr_scheduler)
        self.offload = Offloader("critic", module, optimizer, self.device,
                                 fsdp.param_offload and not fsdp.offload_policy, fsdp.optimizer_offload)
        self.offload.offload()

    def _dp(self) -> int:
        return self.world_size // self.config.critic.ulysses_sequence_parallel_size

    def _micro(self, per_gpu: int | None, global_size: int | None) -> int | None:
        if per_gpu is not None:
            return per_gpu
        return max(1, global_size // self._dp()) if global_size is not None else None

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="critic")
    def compute_values(self, data: DataProto) -> DataProto:
        c = self.config.critic
        micro = self._micro(c.forward_micro_batch_size_per_gpu, c.forward_micro_batch_size) or self._micro(
            c.ppo_micro_batch_size_per_gpu, c.ppo_micro_batch_size)
        timer = PhaseTimer(self.device)
        with self.offload.on_device(), timer.measure():
            values = self.critic.compute_values(data, micro)
        metrics = phase_metrics("critic_infer", self.hf_config, sequence_lengths(data).tolist(), timer, forward_only=True,
                                share=1 / c.ulysses_sequence_parallel_size)
        return DataProto({"values": values.cpu()}, meta_info={"metrics": metrics})

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="critic")
    def update_critic(self, data: DataProto) -> DataProto:
        c = self.config.critic
        mini = c.ppo_mini_batch_size * self.config.actor_rollout_ref.rollout.n // self._dp()
        micro = self._micro(c.ppo_micro_batch_size_per_gpu, c.ppo_micro_batch_size)
        start = time.perf_counter()
        timer = PhaseTimer(self.device)
        with self.offload.on_device(optimizer=True), timer.measure():
            metrics = self.critic.update_critic(data, mini, micro)
        metrics.update(phase_metrics("critic", self.hf_config, sequence_lengths(data).tolist() * c.ppo_epochs, timer,
                                     share=1 / c.ulysses_sequence_parallel_size))
        metrics["critic/lr"] = self.lr_scheduler.get_last_lr()[0]
        self.lr_scheduler.step()
        metrics["timing_s/update_critic_worker"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        with self.offload.on_device(optimizer=True):
            self.checkpoint.save(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        with self.offload.on_device(optimizer=True):
            self.checkpoint.load(path)

