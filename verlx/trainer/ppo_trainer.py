"""The driver loop: one PPO / GRPO step = generate, reward, log-probs, values, advantages, updates."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid

import numpy as np
import torch

from verlx.algorithms.advantages import compute_advantage, estimator_needs_greedy_baseline, uses_critic
from verlx.algorithms.dynamic_sampling import keep_informative_groups
from verlx.algorithms.kl import apply_kl_penalty, make_kl_controller
from verlx.batch_columns import (
    LOG_PROB_INPUTS,
    MODEL_INPUTS,
    TEACHER_COLUMNS,
    non_tensor_generation_inputs,
    select_inputs,
)
from verlx.config.schema import PPOConfig
from verlx.metrics.data import compute_data_metrics
from verlx.metrics.multi_turn import multi_turn_metrics
from verlx.metrics.throughput import (
    compute_throughput_metrics,
    compute_timing_metrics,
    step_memory_peak,
    token_counts,
)
from verlx.protocol import DataProto
from verlx.reward.loading import describe_reward_function
from verlx.rollout.agent.inputs import agent_input_keys
from verlx.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)
from verlx.trainer import checkpointing
from verlx.trainer.frozen_log_probs import reference_log_probs, teacher_log_probs
from verlx.trainer.generation_dump import dump_generations
from verlx.trainer.invariants import (
    check_finite_log_probs,
    check_on_policy,
    check_weights_after_skipped_updates,
    on_policy_tolerance,
)
from verlx.trainer.old_log_prob import old_log_prob_phase
from verlx.trainer.resume import ResumePoint, plan_resume
from verlx.trainer.reward_scoring import RewardScorer
from verlx.trainer.reward_signal import RewardSignalMonitor
from verlx.trainer.rollout_modes.staleness import staleness_metrics, stamp
from verlx.trainer.stop_signals import NoStopSignals, StopSignals
from verlx.trainer.validation import Validator
from verlx.utils.paths import expand_path
from verlx.utils.seqlen_balancing import balance_batch
from verlx.utils.timer import timed
from verlx.utils.tracking import Tracking
from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker, WorkerRole
from verlx.workers.critic_worker import CriticWorker
from verlx.workers.engine import engine_class
from verlx.workers.groups import ROLE_GROUPS, ActorRolloutRefGroup, CriticGroup
from verlx.workers.profile_plan import profile_plan, worker_nsight_options
from verlx.workers.reward_model_worker import RewardModelWorker

logger = logging.getLogger(__name__)
SUMMED_REWARD_METRICS = ("reward/errors", "reward/timeouts")


def trainer_worker_class(config: PPOConfig, roles: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """The one actor class of the trainer's colocated roles; its actors run under `nsys profile` (Ray's runtime_env
    nsight) when a role's phases are recorded with Nsight Systems (global_profiler.tool=nsys)."""
    workers = create_colocated_worker_cls(roles)
    nsight = worker_nsight_options(config)
    return workers.with_runtime_env(nsight=nsight) if nsight else workers


class RayPPOTrainer:
    def __init__(self, config: PPOConfig, tokenizer, train_loader, val_loader, reward_fn, val_reward_fn,
                 use_gpu: bool):
        self.config = config
        self.tokenizer = tokenizer
        self.train_loader = train_loader
        self.val_loader = val_loader
        self.reward_fn = reward_fn
        self.val_reward_fn = val_reward_fn
        self.use_gpu = use_gpu
        self.use_critic = uses_critic(config)
        self.use_reference = config.use_reference
        self.world_size = config.trainer.nnodes * config.trainer.n_gpus_per_node
        self.kl_ctrl = make_kl_controller(config.algorithm.kl_ctrl) if config.algorithm.use_kl_in_reward else None
        self.global_step = 0
        self.initial_loader_state = train_loader.state_dict()
        self.hf_config = _load_model_config(config)
        if config.trainer.total_training_steps is None:
            raise ValueError("trainer.total_training_steps is unresolved: build the trainer from main_ppo.prepare's "
                             "config, which resolves it from the data")
        self.total_steps = config.trainer.total_training_steps
        #: trainer.resume_mode, until a restart after a worker died resumes from the newest intact checkpoint
        self.resume_mode = config.trainer.resume_mode
        self.resume_point: ResumePoint | None = None
        self.resume_planned = False
        self.policy_version = 0  # training steps whose update is done: the weights' version (docs/async.md)
        self.rollout_group = self.pipeline = None
        self.scorer, self.val_scorer = RewardScorer(config, reward_fn), RewardScorer(config, val_reward_fn)
        self.profiles_steps = profile_plan(config) is not None  # the workers are told each step's number
        self.stop: StopSignals = NoStopSignals()  # main_ppo installs the signal handlers
        self.reward_signal = RewardSignalMonitor(
            lambda source: describe_reward_function(config.custom_reward_function, source), config.data.reward_fn_key)

    # ------------------------------------------------------------------ workers
    def init_workers(self) -> None:
        t = self.config.trainer
        self.resource_pool = RayResourcePool([t.n_gpus_per_node] * t.nnodes, use_gpu=self.use_gpu,
                                             name_prefix="verlx")
        engine_class(self.config.actor_rollout_ref.actor.strategy)  # a missing backend fails here, not in Ray
        if self.use_critic:
            engine_class(self.config.critic.strategy, "critic.strategy")
        colocated = self.config.actor_rollout_ref.hybrid_engine
        role = WorkerRole(actor=True, rollout=colocated, ref=self.use_reference)
        roles = {"actor_rollout_ref": RayClassWithInitArgs(ActorRolloutRefWorker, config=self.config, role=role)}
        if self.use_critic:
            roles["critic"] = RayClassWithInitArgs(CriticWorker, config=self.config)
        if self.config.reward_model.enable:
            roles["reward_model"] = RayClassWithInitArgs(RewardModelWorker, config=self.config)
        self.worker_group = RayWorkerGroup(self.resource_pool, trainer_worker_class(self.config, roles), name="verlx")
        logger.info("trainer workers (%s): %s", "+".join(roles), self.worker_group.placement())
        views = self.worker_group.spawn({name: ROLE_GROUPS[name] for name in roles})
        for view in views.values():
            view.set_timeouts(t.phase_timeout_s, **t.phase_timeouts)
        self.actor_rollout_wg: ActorRolloutRefGroup = views["actor_rollout_ref"]
        self.critic_wg: CriticGroup | None = views.get("critic")
        if self.critic_wg is not None:
            log_worker_settings("critic", self.critic_wg.init_model())
        if "reward_model" in views:  # its scores come before the reward manager's (trainer/reward_scoring.py)
            log_worker_settings("reward model", views["reward_model"].init_model())
            self.scorer = RewardScorer(self.config, self.reward_fn, views["reward_model"], self.world_size)
            self.val_scorer = RewardScorer(self.config, self.val_reward_fn, views["reward_model"], self.world_size)
        log_worker_settings("actor", self.actor_rollout_wg.init_model())
        self.generator = self.actor_rollout_wg  # what generates: the colocated engines, or a rollout group
        if not colocated:
            from verlx.trainer.rollout_modes.rollout_group import RolloutGroup

            self.rollout_group = RolloutGroup(self.config, self.use_gpu, self.actor_rollout_wg,
                                              lambda: self.policy_version)
            self.generator = self.rollout_group

    def shutdown(self) -> None:
        if self.rollout_group is not None:
            self.rollout_group.shutdown()
            self.rollout_group = None
        if hasattr(self, "worker_group"):
            self.worker_group.shutdown()
            self.resource_pool.release()
            del self.worker_group

    def prepare_restart(self) -> None:
        """After a worker died: new workers, resume from the latest complete checkpoint (or from the start)."""
        self.shutdown()
        self.resume_mode = "auto"
        self.global_step = self.policy_version = 0
        self.train_loader.load_state_dict(self.initial_loader_state)
        if self.kl_ctrl is not None:
            self.kl_ctrl = make_kl_controller(self.config.algorithm.kl_ctrl)
        self.resume_planned = False

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> str:
        t = self.config.trainer
        root = expand_path(t.default_local_dir, absolute=True)
        tmp = checkpointing.temp_step_dir(root, self.global_step)
        with checkpointing.save_errors(root, tmp):
            os.makedirs(root, exist_ok=True)
            self.actor_rollout_wg.save_checkpoint(os.path.join(tmp, "actor"))
            if self.use_critic:
                self.critic_wg.save_checkpoint(os.path.join(tmp, "critic"))
            state = {"global_step": self.global_step, "dataloader": self._consumed_loader_state(),
                     "kl_coef": self.kl_ctrl.value if self.kl_ctrl else None}
            checkpointing.write_driver_state(tmp, state, dataclasses.asdict(self.config))
            final = checkpointing.finalize(tmp, root, self.global_step, self.use_critic)
        checkpointing.prune(root, t.max_actor_ckpt_to_keep, newest=self.global_step)
        return final

    def plan_resume(self) -> ResumePoint | None:
        """Pick, verify and compare the checkpoint to resume from; runs before any worker starts (trainer/resume.py)."""
        self.resume_point = plan_resume(self.config, self.hf_config, self.total_steps, self.use_critic,
                                        self.resume_mode)
        self.resume_planned = True
        return self.resume_point

    def load_checkpoint(self) -> None:
        point = self.resume_point if self.resume_planned else self.plan_resume()
        if point is None:
            return
        self.actor_rollout_wg.load_checkpoint(os.path.join(point.path, "actor"))
        if self.use_critic:
            self.critic_wg.load_checkpoint(os.path.join(point.path, "critic"))
        self.train_loader.load_state_dict(point.state["dataloader"])
        kl_settings_changed = any(k.startswith("algorithm.kl_ctrl.") for k in point.changed_keys)
        if self.kl_ctrl is not None and point.state.get("kl_coef") is not None and not kl_settings_changed:
            self.kl_ctrl.value = point.state["kl_coef"]
        self.global_step = self.policy_version = point.state["global_step"]
        logger.info("resumed from %s at step %d", point.path, self.global_step)

    # ------------------------------------------------------------------ the loop
    def fit(self) -> dict[str, float]:
        t = self.config.trainer
        tracker = Tracking(t.loggers, t.project_name, t.experiment_name, dataclasses.asdict(self.config),
                           expand_path(t.output_dir))
        validator = Validator(self.config, self.generator, self.val_scorer, self.tokenizer)
        self.load_checkpoint()
        last_metrics: dict[str, float] = {}
        try:
            if self.val_loader is not None and t.val_before_train and (self.global_step == 0 or t.val_only):
                val_metrics = validator.run(self.val_loader)
                tracker.log(val_metrics, step=self.global_step)
                last_metrics.update(val_metrics)
                if t.val_only:
                    return last_metrics
            progress = _progress_bar(self.total_steps, self.global_step, t.progress_bar)
            batches = self._endless_batches()
            self.pipeline = self._start_pipeline(batches)
            with self.stop.step_loop():
                while self.global_step < self.total_steps:
                    if self.profiles_steps:  # global_profiler.steps (workers/profile_plan.py)
                        self.actor_rollout_wg.set_profile_step(self.global_step + 1)
                    if self.pipeline is None:  # sync: this step generates its batch
                        batch = next(batches)
                        self.global_step += 1
                        metrics = self.train_step(batch, batches)
                    else:  # one_step_off / async: the batch the rollout group generated while earlier steps trained
                        self.global_step += 1
                        metrics = self.train_step(None, generated=self.pipeline.next())
                    last_step = self.global_step >= self.total_steps
                    if self.val_loader is not None and t.test_freq > 0 and (
                            self.global_step % t.test_freq == 0 or last_step):
                        with timed("testing", timing := {}), self._rollout_paused():
                            metrics.update(validator.run(self.val_loader))
                        metrics.update(compute_timing_metrics(timing, {"response": 0, "all": 0, "prompt": 0}))
                    saved = self._save_if_due(metrics, last_step)
                    metrics["training/global_step"] = self.global_step
                    metrics["training/epoch"] = self._consumed_loader_state()["sampler"]["epoch"]
                    tracker.log(metrics, step=self.global_step)
                    last_metrics = metrics
                    if progress is not None:
                        progress.update(1)
                    if not last_step:  # a signal's safe point (trainer/stop_signals.py)
                        self.stop.stop_point(self.global_step, saved, self.save_checkpoint)
        finally:
            tracker.finish()
        return last_metrics

    def _save_if_due(self, metrics: dict, last_step: bool) -> str | None:
        """Save at trainer.save_freq, at the last step, and when a signal asked to stop; the path, or None."""
        t = self.config.trainer
        if not (t.save_freq > 0 and (self.global_step % t.save_freq == 0 or last_step)) and not self.stop.requested:
            return None
        with timed("save_checkpoint", timing := {}):
            path = self.save_checkpoint()
        metrics["timing_s/save_checkpoint"] = timing["save_checkpoint"]
        self._advance_rollout()
        return path

    def _start_pipeline(self, batches):
        """one_step_off / async: the generation pipeline on the rollout group (trainer/rollout_modes/pipeline.py);
        None in sync mode."""
        if self.config.trainer.rollout_mode == "sync":
            return None
        from verlx.trainer.rollout_modes.pipeline import RolloutPipeline

        return RolloutPipeline(self.config, self.rollout_group, batches, self.train_loader, self._expand,
                               self._gen_inputs, lambda: self.policy_version, self.global_step + 1, self.total_steps)

    def _advance_rollout(self) -> None:
        """The trainer's workers are idle between two phases: the rollout group may start or continue a generation
        now, and receive newer weights first (one_step_off / async; nothing in sync mode)."""
        if self.pipeline is not None:
            self.pipeline.pump()

    def _rollout_paused(self):
        return self.pipeline.paused() if self.pipeline is not None else contextlib.nullcontext()

    def _consumed_loader_state(self) -> dict:
        """The data position after the last batch training consumed (the pipeline reads ahead of it)."""
        return self.pipeline.consumed_loader_state if self.pipeline is not None else self.train_loader.state_dict()

    def _endless_batches(self):
        """Batches across epochs; the loader's state after each batch is what a checkpoint saves."""
        while True:
            yield from self.train_loader

    def train_step(self, batch: DataProto | None, more_batches=None, generated=None) -> dict[str, float]:
        """One step. With DAPO dynamic sampling, `more_batches` supplies prompts until the batch is full. In
        one_step_off / async mode the batch comes `generated` by the pipeline (rollout_modes/pipeline.Generated)."""
        cfg = self.config
        metrics: dict[str, float] = {}
        timing: dict[str, float] = {}
        with timed("step", timing):
            if generated is None:
                batch = self._rollout_and_score(batch, metrics, timing)
            else:
                batch = self._score_generated(generated, metrics, timing)
            metrics.update(self.reward_signal.observe(batch, self.global_step))
            if cfg.algorithm.filter_groups.enable:
                batch = self._fill_with_informative_groups(batch, more_batches, metrics, timing)
            if cfg.trainer.balance_batch:
                metrics.update(balance_batch(batch, self.world_size))
            correction = old_log_prob_phase(cfg, self.actor_rollout_wg, batch, LOG_PROB_INPUTS, metrics, timing)
            check_finite_log_probs(batch.batch["old_log_probs"], batch.batch["response_mask"], self.global_step,
                                   cfg.actor_rollout_ref.actor.optim.lr)
            self._advance_rollout()
            metrics.update(staleness_metrics(batch, self.policy_version, self._staleness_bound(),
                                             generated.dropped if generated is not None else 0))
            if self.use_reference:
                reference_log_probs(self.actor_rollout_wg, batch, metrics, timing)
                self._advance_rollout()
            if cfg.distillation.enabled:
                teacher_log_probs(self.actor_rollout_wg, batch, metrics, timing)
                self._advance_rollout()
            if self.use_critic:
                self._critic_values(batch, metrics, timing)
                self._advance_rollout()
            with timed("adv", timing):
                if self.kl_ctrl is not None:
                    batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl, cfg.algorithm.kl_penalty)
                    metrics.update(kl_metrics)
                else:
                    batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
                batch = compute_advantage(batch, cfg.algorithm)
            if self.use_critic:
                with timed("update_critic", timing):
                    out = self.critic_wg.update_critic(select_inputs(batch, [*LOG_PROB_INPUTS, "values", "returns"]))
                    metrics.update(out.meta_info["metrics"])
                self._advance_rollout()
            if self.global_step > cfg.trainer.critic_warmup:
                self._update_actor(batch, correction, metrics, timing)
            self.policy_version = self.global_step
            self._advance_rollout()  # the new weights can go to the rollout group now
            if cfg.trainer.rollout_data_dir:
                dump_generations(cfg.trainer.rollout_data_dir, self.global_step, batch, self.tokenizer)
        if self.rollout_group is not None:
            timing["weight_sync"] = self.rollout_group.take_sync_seconds()
        counts = token_counts(batch)
        metrics.update(compute_data_metrics(batch, self.use_critic))
        metrics.update(compute_timing_metrics(timing, counts))
        metrics.update(compute_throughput_metrics(timing, counts, self.world_size))
        metrics.update(step_memory_peak(metrics))
        self.train_loader.after_step(batch)  # a curriculum sampler (data.sampler) learns from the step's batch
        return metrics

    def _update_actor(self, batch: DataProto, correction, metrics: dict, timing: dict) -> None:
        """The actor update, then the checks of what it did (trainer/invariants.py)."""
        cfg = self.config
        with timed("update_actor", timing):
            out = self.actor_rollout_wg.update_actor(self._actor_inputs(batch, correction))
            metrics.update(out.meta_info["metrics"])
            if self.pipeline is not None:  # when the trainer worker ran it: overlap with generation shows
                start, end = out.meta_info["wall_clock"]
                metrics.update({"timestamp/update_actor_start": start, "timestamp/update_actor_end": end})
        check_on_policy(metrics, on_policy_tolerance(cfg.trainer), self.global_step)
        check_weights_after_skipped_updates(metrics, self.actor_rollout_wg, batch, LOG_PROB_INPUTS, self.world_size,
                                            self.global_step, cfg.actor_rollout_ref.actor.optim.lr)

    def _critic_values(self, batch: DataProto, metrics: dict, timing: dict) -> None:
        with timed("values", timing):
            values = self.critic_wg.compute_values(select_inputs(batch, LOG_PROB_INPUTS))
            batch.batch["values"] = values.batch["values"]
            metrics.update(values.meta_info.get("metrics", {}))

    def _expand(self, batch: DataProto) -> DataProto:
        """uid per prompt, n samples each (interleaved)."""
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        return batch.repeat(self.config.actor_rollout_ref.rollout.n, interleave=True)

    def _rollout_and_score(self, batch: DataProto, metrics: dict, timing: dict) -> DataProto:
        """uid per prompt, n samples each (interleaved), generation and reward scores."""
        cfg = self.config
        batch = self._expand(batch)
        with timed("gen", timing):
            gen_out = self._generate(self._gen_inputs(batch), do_sample=True)
        stamp(gen_out, self.policy_version)
        metrics.update(gen_out.meta_info.pop("timing", {}))
        for key, value in gen_out.meta_info.pop("metrics", {}).items():  # DAPO may generate more than once
            metrics[key] = max(value, metrics.get(key, value))
        if estimator_needs_greedy_baseline(cfg.algorithm.adv_estimator):
            with timed("gen_max", timing):
                batch.batch["reward_baselines"] = self._greedy_baseline(batch)
        batch.pop(batch_keys=list(MODEL_INPUTS),
                  non_tensor_batch_keys=non_tensor_generation_inputs(batch.non_tensor_batch))
        batch.union(gen_out)
        return self._score(batch, metrics, timing)

    def _score_generated(self, generated, metrics: dict, timing: dict) -> DataProto:
        """A batch the pipeline generated: its generation's metrics, then reward scores."""
        for key, value in generated.metrics.items():
            if key.startswith("timing_s/"):
                timing[key.removeprefix("timing_s/")] = value
            else:
                metrics[key] = value
        return self._score(generated.batch, metrics, timing)

    def _score(self, batch: DataProto, metrics: dict, timing: dict) -> DataProto:
        """Reward scores of a generated batch (and the agent loops' metrics)."""
        metrics.update(multi_turn_metrics(batch))
        with timed("reward", timing):
            result = self.scorer(batch)
            batch.batch["token_level_scores"] = result.token_level_scores
            for key, values in result.extra.items():
                batch.non_tensor_batch[key] = np.asarray(values)
            for key, value in result.metrics.items():  # failure counts add up over DAPO's generation rounds
                metrics[key] = metrics.get(key, 0.0) + value if key in SUMMED_REWARD_METRICS else value
        return batch

    def _fill_with_informative_groups(self, batch: DataProto, more_batches, metrics: dict, timing: dict):
        """DAPO: drop groups whose samples all scored the same; generate more until train_batch_size prompts."""
        cfg = self.config
        fg = cfg.algorithm.filter_groups
        wanted = cfg.data.train_batch_size * cfg.actor_rollout_ref.rollout.n
        kept = batch[keep_informative_groups(batch, fg.metric)]
        rounds = 1
        while len(kept) < wanted:
            if fg.max_num_gen_batches > 0 and rounds >= fg.max_num_gen_batches:
                raise RuntimeError(
                    f"dynamic sampling: after {rounds} generation batches only {len(kept)} of {wanted} samples come "
                    f"from prompts whose rewards differ (algorithm.filter_groups.metric={fg.metric}); raise "
                    "algorithm.filter_groups.max_num_gen_batches, or check that the reward can tell responses apart"
                )
            if more_batches is None:
                raise RuntimeError("dynamic sampling needs more prompt batches but none were supplied")
            extra = self._rollout_and_score(next(more_batches), metrics, timing)
            part = extra[keep_informative_groups(extra, fg.metric)]
            kept = DataProto.concat([kept, part]) if len(kept) else part
            rounds += 1
        metrics["batch/num_gen_batches"] = float(rounds)
        return kept[:wanted]

    def _actor_inputs(self, batch: DataProto, correction) -> DataProto:
        """What update_actor reads; rollout correction adds IS weights and drops rejected tokens from its mask."""
        keys = [*LOG_PROB_INPUTS, "old_log_probs", "advantages"]
        if self.config.actor_rollout_ref.actor.use_kl_loss:
            keys.append("ref_log_prob")
        keys += [k for k in ("rollout_is_weights", *TEACHER_COLUMNS) if k in batch.batch]
        inputs = select_inputs(batch, keys)
        if correction is not None and correction.mask is not None:
            inputs.batch["response_mask"] = inputs.batch["response_mask"] * correction.mask.to(
                inputs.batch["response_mask"].dtype)
        return inputs

    def _staleness_bound(self) -> int:
        return self.pipeline.staleness_bound() if self.pipeline is not None else 0

    def _gen_inputs(self, batch: DataProto) -> DataProto:
        """The prompt tensors, plus the columns the agent loop reads (rollout.mode=async or multi_turn.enable)."""
        enabled = self.config.actor_rollout_ref.rollout.uses_agent_loop
        return batch.select(list(MODEL_INPUTS), [*non_tensor_generation_inputs(batch.non_tensor_batch),
                                                 *agent_input_keys(batch, enabled)], [])

    def _generate(self, gen_batch: DataProto, do_sample: bool) -> DataProto:
        gen_batch.meta_info.update({"do_sample": do_sample, "global_step": self.global_step,
                                    "seed": self.config.actor_rollout_ref.rollout.seed + self.global_step})
        return self.generator.generate_sequences(gen_batch)

    def _greedy_baseline(self, batch: DataProto) -> torch.Tensor:
        """REMAX: the reward of one greedy response per prompt, the baseline of that prompt's sampled responses."""
        n = self.config.actor_rollout_ref.rollout.n
        prompts = batch[torch.arange(0, len(batch), n)]  # rows are interleaved: one row per prompt
        gen_out = self._generate(self._gen_inputs(prompts), do_sample=False)
        gen_out.meta_info.pop("timing", None)
        gen_out.meta_info.pop("metrics", None)
        greedy = prompts.select(batch_keys=[], non_tensor_batch_keys=None, meta_info_keys=[])
        greedy.union(gen_out)
        return self.scorer(greedy).token_level_scores.sum(-1).repeat_interleave(n)


def log_worker_settings(role: str, results: list) -> None:
    """Log once what rank 0 of a worker group chose for the keys the config left open (workers/memory_plan): the
    ranks agree on the choices, and the workers' own INFO logs are not shown."""
    settings = (results[0] or {}).get("settings") if results else None
    if settings:
        logger.info("%s: %s", role, "; ".join(settings))


def _load_model_config(config: PPOConfig):
    from verlx.models.hf_config import load_hf_config

    model = config.actor_rollout_ref.model
    return load_hf_config(expand_path(model.path), model.trust_remote_code, model.override_config)


def _progress_bar(total: int, initial: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, desc="training", unit="step", dynamic_ncols=True)
