"""CriticWorker: the value model on its training engine (critic.strategy), for GAE."""

from __future__ import annotations

import time

from verlx.config.schema import PPOConfig
from verlx.metrics.phases import phase_metrics
from verlx.models.hf_config import import_external_lib, load_hf_config
from verlx.protocol import DataProto
from verlx.single_controller import Dispatch, Worker, register
from verlx.utils.batch_sizes import per_gpu_micro_batch_size, ppo_batch_sizes
from verlx.utils.compile_cache import compile_cache_note
from verlx.utils.distributed import init_distributed
from verlx.utils.errors import storage_errors
from verlx.utils.paths import expand_path
from verlx.utils.seeding import seed_everything
from verlx.workers.auto_settings import resolve_critic_settings
from verlx.workers.critic import PPOCritic
from verlx.workers.engine import ModelSpec, engine_class
from verlx.workers.memory_plan import process_baseline
from verlx.workers.micro_batching import sequence_lengths
from verlx.workers.perf import training_phase_timer


class CriticWorker(Worker):
    def __init__(self, config: PPOConfig):
        super().__init__()
        self.config = config

    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        init_distributed(timeout_s=self.config.actor_rollout_ref.nccl_timeout)
        settings = compile_cache_note(self.config.trainer.compile_cache_dir)  # before anything compiles
        process_baseline(self.device)  # the GPU's memory in use before this process builds anything
        seed_everything(self.config.trainer.seed + 1000 + self.rank)
        critic = self.config.critic
        path = expand_path(critic.model.path or self.config.actor_rollout_ref.model.path)
        import_external_lib(critic.model.external_lib)
        self.hf_config = load_hf_config(path, critic.model.trust_remote_code, critic.model.override_config)
        self.config, notes = resolve_critic_settings(self.config, self.hf_config, path, self.device, self.world_size)
        cfg = self.config
        critic = cfg.critic
        engine_cls = engine_class(critic.strategy, "critic.strategy")
        placement = engine_cls.place({"critic": critic}, self.hf_config, self.world_size)
        self.set_dispatch_info("critic", placement.dp_rank, placement.dp_size, placement.is_collect)
        self.dp_size = placement.dp_size
        spec = ModelSpec("critic", path, critic.model, critic, self.hf_config, self.device, value_head=True,
                         total_steps=cfg.trainer.total_training_steps or 1,
                         max_consecutive_nonfinite=cfg.trainer.max_consecutive_nonfinite_updates)
        self.critic = PPOCritic(critic, engine_cls.build(spec, placement), dp_size=placement.dp_size)
        self.critic.engine.offload()
        return {"settings": settings + notes}  # the driver logs rank 0's choices

    def _micro(self, per_gpu: int | None, global_size: int | None) -> int | None:
        return per_gpu_micro_batch_size(per_gpu, global_size, self.dp_size)

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="critic")
    def compute_values(self, data: DataProto) -> DataProto:
        c = self.config.critic
        micro = self._micro(c.forward_micro_batch_size_per_gpu, c.forward_micro_batch_size) or self._micro(
            c.ppo_micro_batch_size_per_gpu, c.ppo_micro_batch_size)
        timer = training_phase_timer(self.device, "critic_infer", self.rank)
        with self.critic.engine.on_device(overlap=True), timer.measure():
            values = self.critic.compute_values(data, micro)
        metrics = phase_metrics("critic_infer", self.hf_config, sequence_lengths(data).tolist(), timer,
                                forward_only=True, share=1 / c.ulysses_sequence_parallel_size)
        return DataProto({"values": values.cpu()}, meta_info={"metrics": metrics})

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="critic")
    def update_critic(self, data: DataProto) -> DataProto:
        c = self.config.critic
        sizes = ppo_batch_sizes(c, self.config.actor_rollout_ref.rollout.n, self.dp_size)
        start = time.perf_counter()
        timer = training_phase_timer(self.device, "critic", self.rank)
        with self.critic.engine.on_device(optimizer=True, overlap=True), timer.measure():
            metrics = self.critic.update_critic(data, sizes.mini, sizes.micro)
        metrics.update(phase_metrics("critic", self.hf_config, sequence_lengths(data).tolist() * c.ppo_epochs, timer,
                                     share=1 / c.ulysses_sequence_parallel_size))
        metrics["critic/lr"] = self.critic.engine.lr()
        self.critic.engine.step_lr()
        metrics["timing_s/update_critic_worker"] = time.perf_counter() - start
        return DataProto(meta_info={"metrics": metrics})

    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        with self.critic.engine.on_device(optimizer=True), storage_errors("the critic checkpoint", path):
            self.critic.engine.save_checkpoint(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        with self.critic.engine.on_device(optimizer=True):
            self.critic.engine.load_checkpoint(path)
