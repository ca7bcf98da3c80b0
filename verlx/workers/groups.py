"""The worker groups the drivers talk to, one class per worker class: each method the driver may call on a group is
declared here, one line each, naming the worker method it runs on every rank (single_controller's group_method).
tests/unit/test_worker_groups.py checks that every @register-ed worker method has its line."""

from __future__ import annotations

from verlx.single_controller.ray import RayWorkerGroup, group_method
from verlx.workers.actor_rollout_ref_worker import ActorRolloutRefWorker
from verlx.workers.critic_worker import CriticWorker
from verlx.workers.reward_model_worker import RewardModelWorker


class ActorRolloutRefGroup(RayWorkerGroup):
    """The policy's workers (actor, rollout engine, reference), or a rollout worker group of its own."""

    init_model = group_method(ActorRolloutRefWorker.init_model)
    generate_sequences = group_method(ActorRolloutRefWorker.generate_sequences)
    interrupt_generation = group_method(ActorRolloutRefWorker.interrupt_generation)
    compute_log_prob = group_method(ActorRolloutRefWorker.compute_log_prob)
    compute_ref_log_prob = group_method(ActorRolloutRefWorker.compute_ref_log_prob)
    compute_teacher_log_prob = group_method(ActorRolloutRefWorker.compute_teacher_log_prob)
    update_actor = group_method(ActorRolloutRefWorker.update_actor)
    save_checkpoint = group_method(ActorRolloutRefWorker.save_checkpoint)
    load_checkpoint = group_method(ActorRolloutRefWorker.load_checkpoint)
    weight_transfer_address = group_method(ActorRolloutRefWorker.weight_transfer_address)
    join_weight_transfer = group_method(ActorRolloutRefWorker.join_weight_transfer)
    send_weights = group_method(ActorRolloutRefWorker.send_weights)
    receive_weights = group_method(ActorRolloutRefWorker.receive_weights)
    set_profile_step = group_method(ActorRolloutRefWorker.set_profile_step)


class CriticGroup(RayWorkerGroup):
    init_model = group_method(CriticWorker.init_model)
    compute_values = group_method(CriticWorker.compute_values)
    update_critic = group_method(CriticWorker.update_critic)
    save_checkpoint = group_method(CriticWorker.save_checkpoint)
    load_checkpoint = group_method(CriticWorker.load_checkpoint)


class RewardModelGroup(RayWorkerGroup):
    init_model = group_method(RewardModelWorker.init_model)
    compute_rm_score = group_method(RewardModelWorker.compute_rm_score)


#: role (of the colocated worker) -> (its group class, its worker class)
ROLE_GROUPS = {
    "actor_rollout_ref": (ActorRolloutRefGroup, ActorRolloutRefWorker),
    "critic": (CriticGroup, CriticWorker),
    "reward_model": (RewardModelGroup, RewardModelWorker),
}
