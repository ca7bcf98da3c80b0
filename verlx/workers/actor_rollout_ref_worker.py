"""ActorRolloutRefWorker: the policy's training shards, its reference and its rollout engine in one process."""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack

import torch

from verlx.algorithms.kl import kl_needs_full_distribution
from verlx.config.schema import PPOConfig
from verlx.models.ulysses import check_ulysses, sequence_parallel_group
from verlx.protocol import DataProto
from verlx.rollout.base import RolloutContext, get_engine_class
from verlx.models.lora import lora_scaling, merged_weights
from verlx.rollout.weight_sync import gather_full, iter_engine_weights
from verlx.single_controller import Dispatch, Worker, register
from verlx.utils.distributed import init_distributed
from verlx.utils.dtypes import torch_dtype
from verlx.utils.seeding import seed_everything
from verlx.workers.actor import PPOActor
from verlx.workers.fsdp.checkpoint import FSDPCheckpointManager
from verlx.workers.stats import optimizer_state_bytes
from verlx.workers.fsdp.model_builder import (
    apply_fsdp2,
    build_lr_scheduler,
    build_optimizer,
    compile_for_training,
    expand_path,
    import_external_lib,
    load_hf_config,
    load_policy,
)
from verlx.workers.fsdp.offload import Offloader
from verlx.workers.micro_batching import sequence_lengths
from verlx.workers.perf import PhaseTimer, phase_metrics
from verlx.workers.tokenizer import load_tokenizer, stop_token_ids

logger = logging.getLogger(__name__)
ROLES = ("actor", "rollout", "ref")


class ActorRolloutRefWorker(Worker):
    """`role` is any '_'-joined combination of actor, rollout and ref (e.g. actor_rollout_ref, ref)."""

    def __init__(self, config: PPOConfig, role: str = "actor_rollout_ref"):
        super().__init__()
        parts = set(role.split("_"))
        unknown = parts - set(ROLES)
        if unknown or not parts:
            raise ValueError(f"role {role!r}: parts must be among {ROLES}, got unknown {sorted(unknown)}")
        self.config = config
        self.role = role
        self.is_actor, self.is_rollout, self.is_ref = ("actor" in parts, "rollout" in parts, "ref" in parts)
        self.actor = self.ref = self.engine = None
        self.actor_offload = self.ref_offload = None
        self.lora = False
        self.engine_weights_stale = True
        self.engine_asleep_gb: float | None = None

    # ------------------------------------------------------------------ set-up
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        cfg = self.config
        arr = cfg.actor_rollout_ref
        model_path = self._init_process_and_model_metadata()
        on_gpu = self.device.type == "cuda"
        import_external_lib(arr.model.external_lib)  # the engine may be built first and needs the architecture too
        sp_group, dp_size = self._init_sequence_parallel()
        if self.is_rollout:  # first: engines that size their cache from free memory must see it before training
            self._init_engine(model_path)
        if self.is_actor:
            fsdp = arr.actor.fsdp_config
            self.lora = arr.model.lora_rank > 0
            if self.lora and self.is_rollout and self.rank == 0:
                logger.info("LoRA: the %s rollout engine receives the actor's weights with the adapters merged in "
                            "at every push (no engine here loads adapters separately)", arr.rollout.name)
            module = load_policy(model_path, arr.model, torch_dtype(fsdp.model_dtype), sp_group=sp_group,
                                 with_lora=self.lora)
            compile_for_training(module, arr.actor.use_torch_compile, self.device)
            apply_fsdp2(module, self.device, torch_dtype(fsdp.dtype), fsdp.reshard_after_forward,
                        cpu_offload=fsdp.offload_policy and on_gpu,
                        grad_divide_factor=dp_size if sp_group is not None else None)
            optimizer = build_optimizer(module.parameters(), arr.actor.optim)
            self.actor_offload = Offloader("actor", module, optimizer, self.device,
                                           fsdp.param_offload and not fsdp.offload_policy, fsdp.optimizer_offload)
            self.lr_scheduler = build_lr_scheduler(optimizer, arr.actor.optim, cfg.trainer.total_training_steps or 1)
            self.actor = PPOActor(arr.actor, module, optimizer, self.device,
                                  cfg.trainer.max_consecutive_nonfinite_updates)
            self.checkpoint = FSDPCheckpointManager(module, optimizer, self.lr_scheduler, self.tokenizer,
                                                    self.hf_config, strip_prefix="hf_model.")
        if self.is_ref and self.is_actor and self.lora:
            self.ref = PPOActor(arr.actor, self.actor.module, None, self.device, adapters_disabled=True)
            self.actor.reference = self.ref
        elif self.is_ref:
            ref_fsdp = arr.ref.fsdp_config
            ref_model_cfg = type(arr.model)(**{**arr.model.__dict__, "enable_gradient_checkpointing": False})
            ref_module = load_policy(model_path, ref_model_cfg, torch_dtype(ref_fsdp.model_dtype), sp_group=sp_group)
            ref_module.requires_grad_(False)
            compile_for_training(ref_module, arr.ref.use_torch_compile, self.device)
            apply_fsdp2(ref_module, self.device, torch_dtype(ref_fsdp.dtype), ref_fsdp.reshard_after_forward)
            self.ref = PPOActor(arr.actor, ref_module, None, self.device)
            self.ref_offload = Offloader("ref", ref_module, None, self.device, ref_fsdp.param_offload)
            if self.actor is not None:
                self.actor.reference = self.ref
        for offloader in (self.actor_offload, self.ref_offload):
            if offloader is not None:
                offloader.offload()
        return {"rank": self.rank, "device": str(self.device)}

    def _init_process_and_model_metadata(self) -> str:
        """What every backend's init_model starts with: the process group, seeds, tokenizer and HF config; returns
        the expanded model path."""
        cfg = self.config
        arr = cfg.actor_rollout_ref
        init_distributed(timeout_s=arr.nccl_timeout)
        seed_everything(cfg.trainer.seed + self.rank)
        model_path = expand_path(arr.model.path)
        self.tokenizer = load_tokenizer(arr.model.tokenizer_path or model_path, arr.model.trust_remote_code,
                                        arr.model.custom_chat_template)
        self.hf_config = load_hf_config(model_path, arr.model.trust_remote_code, arr.model.override_config)
        return model_path

    def _on_device(self, actor: bool = False, ref: bool = False, optimizer: bool = False) -> ExitStack:
        """The offloaded parts a phase computes with, on the device for the `with` block (no-ops without offload).
        A LoRA reference is the actor's own module with its adapters disabled, so it needs the actor's weights."""
        stack = ExitStack()
        actor = actor or (ref and self.lora)
        if actor and self.actor_offload is not None:
            stack.enter_context(self.actor_offload.on_device(optimizer=optimizer))
        if ref and self.ref_offload is not None:
            stack.enter_context(self.ref_offload.on_device())
        return stack

    def _sp_size(self) -> int:
        return self.config.actor_rollout_ref.actor.ulysses_sequence_parallel_size

    def _init_sequence_parallel(self):
        """Ulysses: SP groups of consecutive ranks share one data shard (mesh "actor"); returns (group, dp size)."""
        arr = self.config.actor_rollout_ref
        sizes = {"actor_rollout_ref.actor": arr.actor.ulysses_sequence_parallel_size} if self.is_actor else {}
        if self.is_ref:
            sizes["actor_rollout_ref.ref"] = arr.ref.ulysses_sequence_parallel_size
        if len(set(sizes.values())) > 1:
            raise ValueError(f"the actor and the reference share workers and need one Ulysses size, got {sizes}")
        sp = next(iter(sizes.values()), 1)
        if sp > 1:
            check_ulysses(self.hf_config, sp, self.world_size, f"{next(iter(sizes))}.ulysses_sequence_parallel_size")
        group, dp_rank, dp_size = sequence_parallel_group(sp)
        self.set_dispatch_info("actor", dp_rank, dp_size, self.rank % sp == 0)
        return group, dp_size

    def _init_engine(self, model_path: str) -> None:
        rollout = self.config.actor_rollout_ref.rollout
        if not self.is_actor and rollout.load_format.startswith("dummy"):
            raise ValueError(
                f"role {self.role} has no actor to push weights into its rollout engine, so "
                f"actor_rollout_ref.rollout.load_format={rollout.load_format} would generate from random weights; "
                "set rollout.load_format=auto to load them from the model path"
            )
        tp = rollout.tensor_model_parallel_size
        engine_cls = get_engine_class(rollout.name)
        self.engine_name = rollout.name
        ctx = RolloutContext(
            config=rollout,
            model_path=model_path,
            hf_config=self.hf_config,
            device=self.device,
            pad_token_id=self.tokenizer.pad_token_id,
            eos_token_ids=stop_token_ids(self.tokenizer, model_path),
            rank=self.rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            tp_size=tp,
            n_gpus_per_node=self.config.trainer.n_gpus_per_node,
            trust_remote_code=self.config.actor_rollout_ref.model.trust_remote_code,
        )
        self.set_dispatch_info("rollout", ctx.dp_rank, ctx.dp_size, ctx.tp_rank == 0)
        used_before = self._device_used_bytes()
        self.engine = engine_cls(ctx)
        self.engine_ctx = ctx
        # Without an actor nothing pushes weights: the engine's own, loaded from model_path, are the ones to use.
        self.engine_weights_stale = self.is_actor
        self.engine_asleep = bool(rollout.free_cache_engine)
        if self.engine_asleep:
            self.engine.sleep()
            if used_before is not None:  # nothing else is on the device yet: the difference is the sleeping engine
                self.engine_asleep_gb = (self._device_used_bytes() - used_before) / 2**30

    # ------------------------------------------------------------------ rollout
    def _push_weights(self) -> float:
        """Stream the actor's full weights into the engine as one push (the engine buckets them and knows when
        every parameter has arrived); returns seconds taken."""
        start = time.perf_counter()
        dtype = self.engine_ctx.engine_dtype
        tied = bool(getattr(self.hf_config, "tie_word_embeddings", False))
        state = ((k.removeprefix("hf_model."), v) for k, v in self.actor.module.state_dict().items())
        if self.lora:  # engines get plain HF weights with the adapters merged in
            state = merged_weights(gather_full(state), lora_scaling(self.actor.module.hf_model))
        self.engine.update_weights(iter_engine_weights(state, dtype, tied, device=self.device))
        self.engine_weights_stale = False
        return time.perf_counter() - start

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="rollout")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        if self.engine is None:
            raise RuntimeError(f"role {self.role} has no rollout engine")
        timing = {}
        start = time.perf_counter()
        timer = PhaseTimer(self.device)
        with timer.measure():
            if self.engine_asleep:
                self.engine.wake_up(("weights",))
            if self.engine_weights_stale:
                if not self.is_actor:
                    raise RuntimeError("the rollout engine needs weights from an actor in the same worker")
                with self._on_device(actor=True):
                    timing["timing_s/update_weights"] = self._push_weights()
            if self.engine_asleep:
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()  # cached free blocks are invisible to an engine that asks the driver
                self.engine.wake_up(("kv_cache",))
            gen_start = time.perf_counter()
            try:
                if self.config.actor_rollout_ref.rollout.multi_turn.enable:
                    out = self._agent_runner().generate(self.engine, prompts)
                else:
                    out = self.engine.generate(prompts)
            except Exception as e:
                e.add_note(f"while the {self.engine_name} rollout engine of rank {self.rank} was generating (step "
                           f"{prompts.meta_info.get('global_step', '?')}); checkpoints on disk are not touched by a "
                           "failed step")
                raise
            timing["timing_s/generate_engine"] = time.perf_counter() - gen_start
            if self.config.actor_rollout_ref.rollout.free_cache_engine:
                self.engine.sleep()
                self.engine_asleep = True
        timing["timing_s/rollout_worker"] = time.perf_counter() - start
        out.meta_info["timing"] = timing
        # the rollout's peak (engine weights and KV cache on top of what training keeps resident) is often the step's
        out.meta_info["metrics"] = {**phase_metrics("gen", self.hf_config, [], timer), **self._asleep_memory()}
        return out

    def _agent_runner(self):
        """Multi-turn rollouts: the agent-loop runner (tools loaded once per worker); docs/multi_turn.md."""
        if getattr(self, "agent_runner", None) is None:
            from verlx.rollout.agent.runner import AgentLoopRunner

            self.agent_runner = AgentLoopRunner(
                self.config.actor_rollout_ref.rollout, self.tokenizer, self.engine_ctx.eos_token_ids,
                self.engine_ctx.pad_token_id, self.config.data.apply_chat_template_kwargs)
        return self.agent_runner

    def _device_used_bytes(self) -> int | None:
        """Bytes in use on this worker's GPU by every process (engines may run their own), None on CPU."""
        if self.device.type != "cuda":
            return None
        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return total - free

    def _asleep_memory(self) -> dict[str, float]:
        """What the engine keeps on the GPU while it sleeps (its processes' contexts, CUDA graphs, pools), measured
        when it was built: device memory in use after its first sleep minus before it was created."""
        return {} if self.engine_asleep_gb is None else {"rollout/engine_asleep_gb": self.engine_asleep_gb}

    # ------------------------------------------------------------------ log-probs
    def _log_prob_batching(self, use_ref: bool):
        arr = self.config.actor_rollout_ref
        src = arr.ref if use_ref else arr.rollout
        micro = src.log_prob_micro_batch_size_per_gpu
        if micro is None and src.log_prob_micro_batch_size is not None:
            micro = max(1, src.log_prob_micro_batch_size // self._dp_size())
        return micro, src.log_prob_use_dynamic_bsz, src.log_prob_max_token_len_per_gpu

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        micro, dynamic, max_tokens = self._log_prob_batching(use_ref=False)
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        timer = PhaseTimer(self.device)
        with self._on_device(actor=True), timer.measure():
            log_prob, entropy = self.actor.compute_log_prob(data, micro, dynamic, max_tokens, calculate_entropy=True)
        metrics = phase_metrics("actor_infer", self.hf_config, sequence_lengths(data).tolist(), timer, forward_only=True,
                                share=1 / self._sp_size())
        return DataProto({"old_log_probs": log_prob.cpu(), "entropys": entropy.cpu()}, meta_info={"metrics": metrics})

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        if self.ref is None:
            raise RuntimeError(f"role {self.role} has no reference model")
        micro, dynamic, max_tokens = self._log_prob_batching(use_ref=True)
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        timer = PhaseTimer(self.device)
        with self._on_device(ref=True), timer.measure():
            log_prob, _ = self.ref.compute_log_prob(data, micro, dynamic, max_tokens)
        metrics = phase_metrics("ref", self.hf_config, sequence_lengths(data).tolist(), timer, forward_only=True,
                                share=1 / self._sp_size())
        out = DataProto({"ref_log_prob": log_prob.cpu()}, meta_info={"metrics": metrics})
        if kl_needs_full_distribution(self.config.algorithm.kl_penalty) and self.config.algorithm.use_kl_in_reward:
            with self._on_device(actor=True, ref=True):
                out.batch["full_kl"] = self.actor.compute_full_kl(data, micro).cpu()
        return out

    # ------------------------------------------------------------------ training
    def _dp_size(self) -> int:
        """Data-parallel ranks the training batch is split over."""
        return self.world_size // self._sp_size()

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def update_actor(self, data: DataProto) -> DataProto:
        arr = self.config.actor_rollout_ref
        actor_cfg = arr.actor
        dp = self._dp_size()
        mini = actor_cfg.ppo_mini_batch_size * arr.rollout.n // dp
        micro = actor_cfg.ppo_micro_batch_size_per_gpu
        if micro is None and actor_cfg.ppo_micro_batch_size is not None:
            micro = max(1, actor_cfg.ppo_micro_batch_size // dp)
        data.meta_info.setdefault("temperature", arr.rollout.temperature)
        start = time.perf_counter()
        full_kl = actor_cfg.use_kl_loss and kl_needs_full_distribution(actor_cfg.kl_loss_type)
        timer = PhaseTimer(self.device)
        with self._on_device(actor=True, ref=full_kl, optimizer=True), timer.measure():
            metrics = self.actor.update_policy(data, mini, micro)
        metrics.update(phase_metrics("actor", self.hf_config, sequence_lengths(data).tolist() * actor_cfg.ppo_epochs, timer,
                                     share=1 / self._sp_size()))
        metrics["actor/lr"] = self.lr_scheduler.get_last_lr()[0]
        metrics["actor/optimizer_state_gb"] = optimizer_state_bytes(self.actor.optimizer) / 1e9
        self.lr_scheduler.step()
        metrics["timing_s/update_actor_worker"] = time.perf_counter() - start
        self.engine_weights_stale = True
        return DataProto(meta_info={"metrics": metrics})

    # ------------------------------------------------------------------ checkpoints
    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        with self._on_device(actor=True, optimizer=True):
            self.checkpoint.save(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        with self._on_device(actor=True, optimizer=True):
            self.checkpoint.load(path)
        self.engine_weights_stale = True

