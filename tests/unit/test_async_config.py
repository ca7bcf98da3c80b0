"""Bad input of the rollout modes is refused before Ray starts, naming the keys (docs/async.md, "Bad input")."""

from __future__ import annotations

import pytest

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer.preflight import validate

SEPARATE = ["actor_rollout_ref.hybrid_engine=false", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1",
            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "trainer.device=cpu",
            "algorithm.adv_estimator=grpo"]


def problems(*overrides) -> list[str]:
    cfg = build(PPOConfig, to_container(load_yaml(overrides=[*SEPARATE, *overrides])))
    with pytest.raises(ConfigError) as info:
        validate(cfg, check_files=False)
    return info.value.problems


def accepted(*overrides) -> None:
    validate(build(PPOConfig, to_container(load_yaml(overrides=[*SEPARATE, *overrides]))), check_files=False)


def test_modes_that_are_accepted():
    accepted("trainer.rollout_mode=one_step_off")
    accepted("trainer.rollout_mode=async", "trainer.max_staleness=0")
    accepted("trainer.rollout_mode=async", "trainer.max_staleness=3", "trainer.staleness_policy=drop")
    for engine in ("native", "sglang", "vllm"):
        accepted("trainer.rollout_mode=async", "trainer.max_staleness=1", "trainer.partial_rollout=true",
                 f"actor_rollout_ref.rollout.name={engine}")
    accepted("trainer.rollout_mode=sync")  # a rollout group of its own, generating and training in turn
    accepted("trainer.rollout_mode=sync", "algorithm.rollout_correction.rollout_is=token")


@pytest.mark.parametrize("overrides,message", [
    (["trainer.max_staleness=2"], "trainer.max_staleness=2 with trainer.rollout_mode=sync"),
    (["trainer.rollout_mode=one_step_off", "trainer.max_staleness=3"], "whose staleness is 1 by definition"),
    (["trainer.rollout_mode=async"], "trainer.rollout_mode=async needs trainer.max_staleness >= 0"),
    (["trainer.rollout_mode=async", "trainer.max_staleness=-1"], "needs trainer.max_staleness >= 0 (got -1)"),
    (["rollout.n_gpus_per_node=0"], "a rollout worker group with at least one GPU: rollout.nnodes=1 × "
                                    "rollout.n_gpus_per_node=0 gives none"),
    (["trainer.rollout_mode=one_step_off", "actor_rollout_ref.hybrid_engine=true", "rollout.n_gpus_per_node=0"],
     "set actor_rollout_ref.hybrid_engine=false"),
    (["actor_rollout_ref.hybrid_engine=true"], "rollout.n_gpus_per_node=1 is only used with"),
    (["trainer.rollout_mode=async", "trainer.max_staleness=1", "ray_kwargs.ray_init.num_cpus=1"],
     "need 2 CPUs (ray_kwargs.ray_init.num_cpus) side by side but this machine has 1: their placements would "
     "overlap"),
    (["trainer.rollout_mode=one_step_off", "trainer.nnodes=2", "trainer.n_gpus_per_node=1"],
     "a private Ray instance (neither ray_kwargs.ray_init.address nor RAY_ADDRESS set) has one node"),
    (["algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_threshold=0"],
     "algorithm.rollout_correction.rollout_is_threshold=0.0 must be a positive number"),
    (["trainer.rollout_mode=async", "trainer.max_staleness=1", "trainer.partial_rollout=true",
      "actor_rollout_ref.rollout.name=hf"], "trainer.partial_rollout=true needs a rollout engine that can pause a "
     "generation and continue it with new weights, but actor_rollout_ref.rollout.name=hf cannot "
     "(HFEngine.supports_partial_rollout is False)"),
    (["trainer.rollout_mode=async", "trainer.max_staleness=0", "trainer.partial_rollout=true"],
     "trainer.partial_rollout=true needs trainer.rollout_mode=async with max_staleness >= 1"),
    (["trainer.staleness_policy=drop"], "trainer.staleness_policy=drop applies to trainer.rollout_mode=async only"),
    (["trainer.rollout_mode=sometimes"], "trainer.rollout_mode='sometimes' is not one of"),
    (["trainer.rollout_mode=one_step_off", "algorithm.adv_estimator=remax"], "generates a greedy baseline"),
    (["trainer.rollout_mode=one_step_off", "algorithm.filter_groups.enable=true"], "DAPO dynamic sampling"),
    (["trainer.rollout_mode=one_step_off", "actor_rollout_ref.rollout.calculate_log_probs=false"],
     "needs the engine's log-probs"),
    (["trainer.rollout_stall_timeout_s=0"], "trainer.rollout_stall_timeout_s=0.0 must be positive"),
    (["trainer.on_policy_tolerance=-1"], "trainer.on_policy_tolerance=-1.0 must be >= 0"),
    (["+actor_rollout_ref.actor.fsdp_config.mixed_precision.reduce_dtype=int8"],
     "actor_rollout_ref.actor.fsdp_config.reduce_dtype='int8' is not one of"),
    (["critic.model.fsdp_config.reduce_dtype=fp8"], "critic.model.fsdp_config.reduce_dtype='fp8' is not one of"),
])
def test_bad_input_is_named(overrides, message):
    found = problems(*overrides)
    assert any(message in p for p in found), found


def test_verl_one_step_off_command_line_keys_are_read():
    """veRL's recipe: hybrid_engine=False with rollout.nnodes / rollout.n_gpus_per_node beside trainer.*."""
    cfg = build(PPOConfig, to_container(load_yaml(overrides=[
        "actor_rollout_ref.hybrid_engine=False", "trainer.nnodes=1", "trainer.n_gpus_per_node=6", "rollout.nnodes=1",
        "rollout.n_gpus_per_node=2"])))
    assert (cfg.rollout.nnodes, cfg.rollout.n_gpus_per_node, cfg.actor_rollout_ref.hybrid_engine) == (1, 2, False)


@pytest.mark.parametrize("key", ["trainer.rollout_mode", "trainer.max_staleness", "trainer.partial_rollout",
                                 "actor_rollout_ref.hybrid_engine", "rollout.n_gpus_per_node",
                                 "algorithm.rollout_correction.rollout_is"])
def test_rollout_mode_keys_may_change_on_resume(key):
    """Nothing generated ahead is saved (the data position is the consumed one), so a new mode takes effect."""
    from verlx.trainer.resume import TAKES_EFFECT, rule_for

    assert rule_for(key)[0] == TAKES_EFFECT
