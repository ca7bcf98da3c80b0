"""ActorRolloutRefWorker: the policy's training shards, its reference and its rollout engine in one process."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from contextlib import ExitStack
from dataclasses import dataclass

import torch

from verlx.algorithms.distillation import uses_teacher_topk
from verlx.algorithms.kl import kl_needs_full_distribution
from verlx.batch_columns import (
    ENTROPYS,
    OLD_LOG_PROBS,
    SUM_PI_SQUARED,
    TEACHER_LOG_PROB,
    TEACHER_TOPK_IDS,
    TEACHER_TOPK_LOG_PROBS,
)
from verlx.config.schema import PPOConfig
from verlx.metrics.phases import phase_metrics
from verlx.models.hf_config import import_external_lib, load_hf_config
from verlx.protocol import DataProto
from verlx.rollout.base import PolicyWeights, RolloutContext, get_engine_class
from verlx.rollout.generation import Interruptions
from verlx.rollout.weight_sync import engine_dtype_on
from verlx.single_controller import Dispatch, Worker, register
from verlx.utils.batch_sizes import per_gpu_micro_batch_size, ppo_batch_sizes
from verlx.utils.compile_cache import compile_cache_note
from verlx.utils.distributed import init_distributed
from verlx.utils.errors import storage_errors
from verlx.utils.memory import count_unbacked_allocations
from verlx.utils.paths import expand_path
from verlx.utils.seeding import seed_everything
from verlx.workers.actor import PPOActor
from verlx.workers.auto_settings import resolve_actor_settings
from verlx.workers.engine import ModelSpec, engine_class
from verlx.workers.memory_plan import process_baseline
from verlx.workers.micro_batching import sequence_lengths
from verlx.workers.perf import PhaseTimer, training_phase_timer
from verlx.workers.profiling import StepProfiling, finish_profiling
from verlx.workers.tokenizer import load_tokenizer, stop_token_ids

logger = logging.getLogger(__name__)
ROLES = ("actor", "rollout", "ref")


@dataclass(frozen=True)
class WorkerRole:
    """What one ActorRolloutRefWorker holds: the trainable actor, a rollout engine, the frozen reference. veRL
    spells a role as its parts joined with '_' ("actor_rollout_ref", "ref"): `parse` reads that, `str` writes it."""

    actor: bool = False
    rollout: bool = False
    ref: bool = False

    @classmethod
    def parse(cls, role: str | WorkerRole) -> WorkerRole:
        if isinstance(role, WorkerRole):
            return role
        parts = [p for p in str(role).split("_") if p]
        unknown = sorted(set(parts) - set(ROLES))
        if unknown or not parts:
            raise ValueError(f"role {role!r}: parts must be among {ROLES} joined with '_', got unknown {unknown}")
        return cls(**{p: True for p in parts})

    def __str__(self) -> str:
        return "_".join(p for p in ROLES if getattr(self, p))


class ActorRolloutRefWorker(Worker, StepProfiling):
    """`role`: a WorkerRole, or veRL's spelling of one (e.g. "actor_rollout_ref", "ref")."""

    def __init__(self, config: PPOConfig, role: str | WorkerRole = "actor_rollout_ref"):
        super().__init__()
        self.config = config
        self.role = WorkerRole.parse(role)
        self.actor = self.ref = self.teacher = self.engine = self.engine_ctx = self.agent_runner = None
        self.dp_size = self.world_size
        self.lora = False
        #: the actor's weights: each update and each loaded checkpoint is a new version (the engine holds one)
        self.actor_version = 0
        self.engine_asleep_gb: float | None = None
        self.transfer_store = self.transfer_group = None
        self.interruptions = Interruptions()  # partial rollout (interrupt_generation)
        self.engine_resident_bytes = 0  # what the engine keeps on the GPU while training runs (measured at init)

    @property
    def fed_by_trainer(self) -> bool:
        """A rollout-only worker of hybrid_engine=false: its weights come from the trainer by broadcast
        (workers/weight_transfer.py), and its engine shares its device with nothing."""
        return not self.role.actor and not self.config.actor_rollout_ref.hybrid_engine

    # ------------------------------------------------------------------ set-up
    @register(Dispatch.ONE_TO_ALL)
    def init_model(self) -> dict:
        arr = self.config.actor_rollout_ref
        model_path = self._init_process_and_model_metadata()
        settings = compile_cache_note(self.config.trainer.compile_cache_dir)  # before anything compiles
        process_baseline(self.device)  # the GPU's memory in use before this process builds anything
        import_external_lib(arr.model.external_lib)  # the engine may be built first and needs the architecture too
        if self.role.rollout:  # first: engines that size their cache from free memory must see it before training
            self._init_engine(model_path)
        if self.role.actor or self.role.ref:
            settings += self._resolve_auto_settings(model_path)
            self._init_training(model_path)
        # what verlx chose for the keys left open: the driver logs rank 0's (worker logs are not shown at INFO)
        return {"rank": self.rank, "device": str(self.device), "settings": settings}

    def _init_process_and_model_metadata(self) -> str:
        """The process group, seeds, tokenizer and HF config; returns the expanded model path."""
        cfg = self.config
        arr = cfg.actor_rollout_ref
        init_distributed(timeout_s=arr.nccl_timeout)
        seed_everything(cfg.trainer.seed + self.rank)
        model_path = expand_path(arr.model.path)
        self.tokenizer = load_tokenizer(arr.model.tokenizer_path or model_path, arr.model.trust_remote_code,
                                        arr.model.custom_chat_template)
        self.hf_config = load_hf_config(model_path, arr.model.trust_remote_code, arr.model.override_config)
        return model_path

    def close(self) -> None:
        """The rollout engine stops its server, if it started one (its log removed: a clean stop); an Nsight capture
        range still open over the last profiled step ends (workers/nsight.py)."""
        finish_profiling()
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    def _resolve_auto_settings(self, model_path: str) -> list[str]:
        """Fill the keys left null (token budgets, dynamic batches, gradient checkpointing) from the memory estimate of
        this GPU (workers/memory_plan); returns the choices with their numbers."""
        # a vision-language model is estimated by its text decoder (the checkpoint's parameter count includes the
        # vision tower)
        self.config, notes = resolve_actor_settings(self.config, self.hf_config.get_text_config(), model_path,
                                                    self.device, self.world_size, self.engine_resident_bytes)
        return notes

    def _init_training(self, model_path: str) -> None:
        """The actor's and the reference's training engines (actor_rollout_ref.actor.strategy) on one placement."""
        cfg = self.config
        arr = cfg.actor_rollout_ref
        engine_cls = engine_class(arr.actor.strategy)
        roles = {"actor_rollout_ref.actor": arr.actor} if self.role.actor else {}
        if self.role.ref:
            roles["actor_rollout_ref.ref"] = arr.ref
        placement = engine_cls.place(roles, self.hf_config, self.world_size)
        self.set_dispatch_info("actor", placement.dp_rank, placement.dp_size, placement.is_collect)
        self.dp_size = placement.dp_size
        common = dict(path=model_path, model=arr.model, hf_config=self.hf_config, device=self.device,
                      total_steps=cfg.trainer.total_training_steps or 1)
        if self.role.actor:
            self.lora = arr.model.lora_rank > 0
            if self.lora and self.role.rollout and self.rank == 0:
                logger.info("LoRA: the %s rollout engine receives the actor's weights with the adapters merged in "
                            "at every push (no engine here loads adapters separately)", arr.rollout.name)
            spec = ModelSpec("actor", role=arr.actor, lora=self.lora, tokenizer=self.tokenizer,
                             max_consecutive_nonfinite=cfg.trainer.max_consecutive_nonfinite_updates, **common)
            distill = cfg.distillation
            self.actor = PPOActor(arr.actor, engine_cls.build(spec, placement),
                                  rollout_correction=cfg.algorithm.rollout_correction, dp_size=placement.dp_size,
                                  distillation=distill.distillation_loss if distill.enabled else None)
            if distill.enabled:
                self.teacher = PPOActor(arr.actor, self._build_teacher(engine_cls, placement, common))
        if self.role.ref:
            if self.lora:  # the actor's own module with its adapters switched off
                ref_engine = self.actor.engine.reference_view()
            else:
                ref_engine = engine_cls.build(ModelSpec("ref", role=arr.ref, trainable=False, **common), placement)
            self.ref = PPOActor(arr.actor, ref_engine)
            if self.actor is not None:
                self.actor.reference = self.ref
        for model in (self.actor, self.ref, self.teacher):
            if model is not None:
                model.engine.offload()

    def _build_teacher(self, engine_cls, placement, common: dict):
        """On-policy distillation's teacher (distillation.teacher_models): frozen and offloaded like the reference,
        with the reference's settings (actor_rollout_ref.ref), from its own checkpoint and config.json."""
        arr = self.config.actor_rollout_ref
        path = expand_path(self.config.distillation.teacher.model_path)
        self.teacher_hf_config = load_hf_config(path, arr.model.trust_remote_code, {})
        model = dataclasses.replace(arr.model, path=path, override_config={}, lora_rank=0)
        spec = ModelSpec("teacher", role=arr.ref, trainable=False,
                         **dict(common, path=path, model=model, hf_config=self.teacher_hf_config))
        return engine_cls.build(spec, placement)

    def _on_device(self, actor: bool = False, ref: bool = False, optimizer: bool = False,
                   overlap: bool = False, teacher: bool = False) -> ExitStack:
        """The offloaded parts a phase computes with, on the device for the `with` block (no-ops without offload);
        `overlap` for phases that start with a forward pass (copies overlap compute, workers/fsdp/offload.py).
        A LoRA reference is the actor's own module with its adapters disabled, so it brings the actor's weights."""
        stack = ExitStack()
        if actor and self.actor is not None:
            stack.enter_context(self.actor.engine.on_device(optimizer=optimizer, overlap=overlap))
        if ref and self.ref is not None:
            stack.enter_context(self.ref.engine.on_device(overlap=overlap))
        if teacher and self.teacher is not None:
            stack.enter_context(self.teacher.engine.on_device(overlap=overlap))
        return stack

    def _sp_size(self) -> int:
        return self.config.actor_rollout_ref.actor.ulysses_sequence_parallel_size

    def _init_engine(self, model_path: str) -> None:
        rollout = self.config.actor_rollout_ref.rollout
        if not self.role.actor and not self.fed_by_trainer and rollout.load_format.startswith("dummy"):
            raise ValueError(
                f"role {self.role} has no actor to push weights into its rollout engine, so "
                f"actor_rollout_ref.rollout.load_format={rollout.load_format} would generate from random weights; "
                "set rollout.load_format=auto to load them from the model path"
            )
        tp = rollout.tensor_model_parallel_size
        engine_cls = get_engine_class(rollout.name)
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
            colocated=not self.fed_by_trainer,
        )
        self.set_dispatch_info("rollout", ctx.dp_rank, ctx.dp_size, ctx.tp_rank == 0)
        used_before = self._device_used_bytes()
        self.engine = engine_cls(ctx)
        self.engine_ctx = ctx
        count_unbacked_allocations("rollout engine", self._asleep_engine_unbacked_bytes)
        self.engine.sleep()  # until the first generation (an engine of a rollout group of its own stays awake)
        if used_before is not None:  # no other role allocates meanwhile: the difference is the engine's
            measured = engine_resident_bytes(used_before, self._device_used_bytes())
            self.engine_resident_bytes = measured or 0
            if measured is not None and self.engine.residency.asleep:
                self.engine_asleep_gb = measured / 2**30

    def _asleep_engine_unbacked_bytes(self) -> int:
        """What the sleeping engine keeps allocated to torch without device memory (RolloutEngine.
        unbacked_allocated_bytes); 0 while it is awake or gone. Every role of this process times its phases with it
        (workers/perf.training_phase_timer)."""
        asleep = self.engine is not None and self.engine.residency.asleep
        return self.engine.unbacked_allocated_bytes() if asleep else 0

    # ------------------------------------------------------------------ rollout
    def _actor_weights(self) -> PolicyWeights | None:
        """The weights the engine must generate with: the actor's current version, streamed with the actor's
        parameters on the device; None when no actor pushes them here (the engine's own, or the trainer's
        broadcast)."""
        if self.actor is None:
            return None

        @contextlib.contextmanager
        def stream():
            with self._on_device(actor=True):
                yield self.actor.engine.rollout_weights(self.engine_ctx.engine_dtype)

        return PolicyWeights(self.actor_version, stream)

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="rollout")
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        if self.engine is None:
            raise RuntimeError(f"role {self.role} has no rollout engine")
        if self.fed_by_trainer and self.engine.residency.weights_version is None:
            raise RuntimeError("this rollout worker has received no weights from the trainer yet (receive_weights); "
                               "it would generate from the engine's initial weights")
        start, wall_start = time.perf_counter(), time.time()
        timer = PhaseTimer(self.device, "gen", self.rank)
        with timer.measure(), self.engine.awake(self._actor_weights()) as timing:
            gen_start = time.perf_counter()
            try:
                out = self._generate(prompts)
                timer.note_device_used()
            except Exception as e:
                e.add_note(f"while the {self.engine.name} rollout engine of rank {self.rank} was generating (step "
                           f"{prompts.meta_info.get('global_step', '?')}); checkpoints on disk are not touched by a "
                           "failed step")
                raise
            timing["timing_s/generate_engine"] = time.perf_counter() - gen_start
        timing["timing_s/rollout_worker"] = time.perf_counter() - start
        out.meta_info["timing"] = timing
        # the rollout's peak (engine weights and KV cache on top of what training keeps resident) is often the step's
        out.meta_info["metrics"] = {**phase_metrics("gen", self.hf_config, [], timer), **self._asleep_memory()}
        out.meta_info["wall_clock"] = (wall_start, time.time())  # the asynchronous modes log when it ran
        return out

    def _generate(self, prompts: DataProto) -> DataProto:
        if self.config.actor_rollout_ref.rollout.uses_agent_loop:  # rollout.mode=async or multi_turn.enable
            return self._agent_runner().generate(self.engine, prompts)
        interrupted = self.interruptions.check(prompts.meta_info.get("generation_id"))
        if interrupted is not None:  # partial rollout: stoppable by interrupt_generation
            return self.engine.generate(prompts, interrupted)
        return self.engine.generate(prompts)

    @register(Dispatch.ONE_TO_ALL)
    def interrupt_generation(self, generation_id: int) -> None:
        """Partial rollout: the generation `generation_id` (and any before it) returns at its next step with the
        tokens it has. Runs beside generate_sequences (the rollout group's actors take two calls at once)."""
        self.interruptions.interrupt(generation_id)

    # ------------------------------------------------------------------ weights to a rollout group of its own
    @register(Dispatch.ONE_TO_ALL)
    def weight_transfer_address(self) -> tuple[str, int] | None:
        """Trainer side: rank 0 hosts the transfer group's rendezvous; its (address, port), None on other ranks."""
        if self.rank != 0:
            return None
        from verlx.workers.weight_transfer import open_store

        self.transfer_store = open_store(self.config.actor_rollout_ref.nccl_timeout)
        # this node's address as Ray knows it: the rollout group may run on other hosts (docs/multinode.md)
        return self.node_ip(), self.transfer_store.port

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def join_weight_transfer(self, host: str, port: int, world: int) -> None:
        """Trainer rank 0 joins as group rank 0, rollout rank r as 1 + r; other trainer ranks stay out."""
        from verlx.workers.weight_transfer import join_group

        if self.role.actor and self.rank != 0:
            return
        group_rank = 0 if self.role.actor else 1 + self.rank
        self.transfer_group = join_group(self.transfer_store, host, port, group_rank, world, self.device,
                                         self.config.actor_rollout_ref.nccl_timeout)

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def send_weights(self, version: int) -> dict:
        """Trainer side: every rank gathers the full weights (collective); rank 0 broadcasts them in buckets."""
        from verlx.workers.weight_transfer import send

        start, wall_start = time.perf_counter(), time.time()
        rollout = self.config.actor_rollout_ref.rollout
        with self._on_device(actor=True):
            weights = self.actor.engine.rollout_weights(engine_dtype_on(rollout.dtype, self.device))
            if self.transfer_group is None:
                for _ in weights:  # the gather is collective: every trainer rank takes part
                    pass
                stats = {}
            else:
                stats = send(self.transfer_group, weights, version,
                             rollout.update_weights_bucket_megabytes * 2**20, self.device)
        return {**stats, "seconds": time.perf_counter() - start, "start": wall_start, "end": time.time()}

    @register(Dispatch.ONE_TO_ALL, blocking=False)
    def receive_weights(self, version: int) -> dict:
        """Rollout side: one engine.update_weights call with every tensor of `version` as it arrives."""
        from verlx.workers.weight_transfer import receive

        start = time.perf_counter()
        self.engine.update_weights(receive(self.transfer_group, version, self.device), version=int(version))
        return {"seconds": time.perf_counter() - start}

    def _agent_runner(self):
        """The agent-loop rollout's runner (tools loaded once per worker); docs/rollout.md, docs/multi_turn.md."""
        if self.agent_runner is None:
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
        # blocks this process's allocator caches but does not use (a colocated reward model's load, say) would
        # count as in use before the engine and could be freed by its start-up, making the engine's share negative
        torch.cuda.empty_cache()
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
        micro = per_gpu_micro_batch_size(src.log_prob_micro_batch_size_per_gpu, src.log_prob_micro_batch_size,
                                         self.dp_size)
        return micro, src.log_prob_use_dynamic_bsz, src.log_prob_max_token_len_per_gpu

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def compute_log_prob(self, data: DataProto) -> DataProto:
        micro, dynamic, max_tokens = self._log_prob_batching(use_ref=False)
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        timer = training_phase_timer(self.device, "actor_infer", self.rank)
        sum_pi_squared = bool(data.meta_info.get("calculate_sum_pi_squared", False))
        with self._on_device(actor=True, overlap=True), timer.measure():
            out = self.actor.log_prob_outputs(data, micro, dynamic, max_tokens, calculate_entropy=True,
                                              calculate_sum_pi_squared=sum_pi_squared)
        metrics = phase_metrics("actor_infer", self.hf_config, sequence_lengths(data).tolist(), timer,
                                forward_only=True, share=1 / self._sp_size())
        names = {"log_prob": OLD_LOG_PROBS, "entropy": ENTROPYS, "sum_pi_squared": SUM_PI_SQUARED}
        return DataProto({names[k]: v.cpu() for k, v in out.items()}, meta_info={"metrics": metrics})

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        if self.ref is None:
            raise RuntimeError(f"role {self.role} has no reference model")
        data.meta_info.setdefault("temperature", self.config.actor_rollout_ref.rollout.temperature)
        log_prob, metrics = self._frozen_pass("ref", self.hf_config, data,
                                              lambda *batching: self.ref.compute_log_prob(data, *batching)[0], ref=True)
        out = DataProto({"ref_log_prob": log_prob.cpu()}, meta_info={"metrics": metrics})
        if kl_needs_full_distribution(self.config.algorithm.kl_penalty) and self.config.algorithm.use_kl_in_reward:
            micro, _, _ = self._log_prob_batching(use_ref=True)
            with self._on_device(actor=True, ref=True):
                out.batch["full_kl"] = self.actor.compute_full_kl(data, micro).cpu()
        return out

    @register(Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def compute_teacher_log_prob(self, data: DataProto) -> DataProto:
        """The teacher's log-probs of the sampled responses (on-policy distillation), batched like the reference's, of
        the raw logits (temperature 1) as veRL's teacher server gives them."""
        if self.teacher is None:
            raise RuntimeError(f"role {self.role} has no teacher model (distillation.enabled=false)")
        data.meta_info["temperature"] = 1.0  # veRL's teacher server scores prompt tokens at temperature 1 always
        loss = self.config.distillation.distillation_loss
        if uses_teacher_topk(loss):  # its k likeliest next tokens at each response position, and their log-probs
            out, metrics = self._frozen_pass("teacher", self.teacher_hf_config, data,
                                             lambda *batching: self.teacher.topk_log_probs(data, *batching, loss.topk),
                                             teacher=True)
            columns = {TEACHER_TOPK_IDS: out["topk_ids"].cpu(), TEACHER_TOPK_LOG_PROBS: out["topk_log_probs"].cpu()}
            return DataProto(columns, meta_info={"metrics": metrics})
        log_prob, metrics = self._frozen_pass("teacher", self.teacher_hf_config, data,
                                              lambda *batching: self.teacher.compute_log_prob(data, *batching)[0],
                                              teacher=True)
        return DataProto({TEACHER_LOG_PROB: log_prob.cpu()}, meta_info={"metrics": metrics})

    def _frozen_pass(self, phase: str, hf_config, data: DataProto, compute, **placement):
        """A frozen model's (reference, teacher) forward pass over the batch, batched with the reference's log-prob
        settings, and its phase metrics: `compute(micro_batch_size, use_dynamic_bsz, max_token_len)` runs it;
        `placement` names the model for `_on_device`."""
        micro, dynamic, max_tokens = self._log_prob_batching(use_ref=True)
        timer = training_phase_timer(self.device, phase, self.rank)
        with self._on_device(**placement, overlap=True), timer.measure():
            out = compute(micro, dynamic, max_tokens)
        metrics = phase_metrics(phase, hf_config, sequence_lengths(data).tolist(), timer, forward_only=True,
                                share=1 / self._sp_size())
        return out, metrics

    # ------------------------------------------------------------------ training
    @register(Dispatch.DP_COMPUTE_PROTO, mesh="actor")
    def update_actor(self, data: DataProto) -> DataProto:
        arr = self.config.actor_rollout_ref
        actor_cfg = arr.actor
        sizes = ppo_batch_sizes(actor_cfg, arr.rollout.n, self.dp_size)
        data.meta_info.setdefault("temperature", arr.rollout.temperature)
        start, wall_start = time.perf_counter(), time.time()
        full_kl = actor_cfg.use_kl_loss and kl_needs_full_distribution(actor_cfg.kl_loss_type)
        timer = training_phase_timer(self.device, "actor", self.rank)
        with self._on_device(actor=True, ref=full_kl, optimizer=True, overlap=True), timer.measure():
            metrics = self.actor.update_policy(data, sizes.mini, sizes.micro)
            timer.note_device_used()
        seq_lens = sequence_lengths(data).tolist() * actor_cfg.ppo_epochs
        metrics.update(phase_metrics("actor", self.hf_config, seq_lens, timer, share=1 / self._sp_size()))
        metrics["actor/lr"] = self.actor.engine.lr()
        metrics["actor/optimizer_state_gb"] = self.actor.engine.optimizer_state_bytes() / 1e9
        self.actor.engine.step_lr()
        metrics["timing_s/update_actor_worker"] = time.perf_counter() - start
        self.actor_version += 1
        return DataProto(meta_info={"metrics": metrics, "wall_clock": (wall_start, time.time())})

    # ------------------------------------------------------------------ checkpoints
    @register(Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, path: str) -> None:
        with self._on_device(actor=True, optimizer=True), storage_errors("the actor checkpoint", path):
            self.actor.engine.save_checkpoint(path)

    @register(Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, path: str) -> None:
        with self._on_device(actor=True, optimizer=True):
            self.actor.engine.load_checkpoint(path)
        self.actor_version += 1


def engine_resident_bytes(used_before: int, used_after: int) -> int | None:
    """What building the engine and its first sleep left in use on the device; None when less than nothing (another
    process freed memory meanwhile): said, rather than a negative size that the memory plan would hand to the
    update and rollout/engine_asleep_gb would report."""
    if used_after < used_before:
        logger.warning("rollout engine memory at start-up not measurable: the device's memory in use fell from "
                       "%.2f to %.2f GiB while the engine was built (another process freed memory); the memory plan "
                       "counts the sleeping engine as 0 GiB and rollout/engine_asleep_gb is not reported",
                       used_before / 2**30, used_after / 2**30)
        return None
    return used_after - used_before
