"""Settings that are valid one by one but together train nothing: warned about loudly before Ray starts (veRL
accepts them, so they are not refused), each naming the keys and what would make the run learn."""

from __future__ import annotations

from verlx.config.loader import Findings


def check_learning(cfg, f: Findings) -> None:
    from verlx.algorithms.advantages import estimator_needs_groups

    actor, rollout, t = cfg.actor_rollout_ref.actor, cfg.actor_rollout_ref.rollout, cfg.trainer
    if actor.optim.lr == 0:
        f.warnings.append("actor_rollout_ref.actor.optim.lr=0: the policy never changes, so this run learns nothing; "
                          "set a positive learning rate (e.g. 1e-6)")
    if t.total_training_steps is not None and t.critic_warmup >= t.total_training_steps:
        f.warnings.append(f"trainer.critic_warmup={t.critic_warmup} >= trainer.total_training_steps="
                          f"{t.total_training_steps}: the actor is never updated, only the critic; lower critic_warmup")
    try:
        grouped = estimator_needs_groups(cfg.algorithm.adv_estimator)
    except KeyError:
        return  # an unknown estimator is reported by check_names
    greedy = rollout.temperature == 0 or rollout.top_k == 1
    if grouped and greedy and rollout.n > 1 and rollout.do_sample:
        setting = "temperature=0" if rollout.temperature == 0 else "top_k=1"
        f.warnings.append(
            f"actor_rollout_ref.rollout.{setting} decodes greedily, so the rollout.n={rollout.n} responses to a prompt "
            f"are identical and algorithm.adv_estimator={cfg.algorithm.adv_estimator} gives every one an advantage of "
            "0: the policy will not learn; sample (temperature > 0, top_k=-1)")
