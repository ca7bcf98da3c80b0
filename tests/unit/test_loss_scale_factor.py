"""loss_scale_factor (veRL's key): the divisor of seq-mean-token-sum-norm in the actor's and the critic's losses,
read from the YAML (the critic inherits the actor's), range-checked, and said to do nothing under other modes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.roles import ActorConfig, CriticConfig
from verlx.config.schema import PPOConfig
from verlx.metrics.accumulator import MetricAccumulator
from verlx.protocol import DataProto
from verlx.trainer.preflight import validate
from verlx.workers.actor import compose_policy_loss, select_policy_loss
from verlx.workers.critic import compose_value_loss

# two sequences of a 4-token response width: 3 and 2 valid tokens
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 0.0, 0.0]])
COUNTS = {"num_tokens": torch.tensor(5.0), "num_seqs": torch.tensor(2.0), "dp_size": 1,
          "rank_tokens": torch.tensor(5.0)}


def _policy_loss(**actor) -> float:
    """On-policy (ratio 1) vanilla PPO: each token's loss is -advantage (1 on sequence 0, 2 on sequence 1)."""
    cfg = ActorConfig(loss_agg_mode="seq-mean-token-sum-norm", **actor)
    log_prob = torch.full((2, 4), -0.5)
    mb = DataProto.from_dict({"response_mask": MASK, "old_log_probs": log_prob.clone(),
                              "advantages": torch.tensor([[1.0] * 4, [2.0] * 4])})
    metrics = MetricAccumulator(torch.device("cpu"))
    return float(compose_policy_loss(cfg, select_policy_loss(cfg), mb, log_prob, None, COUNTS, metrics))


def test_the_actor_divides_each_sequence_sum_by_loss_scale_factor():
    # sequence sums -3 and -4; (-3/10 - 4/10) / 2 sequences
    assert _policy_loss(loss_scale_factor=10) == pytest.approx(-0.35)
    # null: the padded response width, 4 (veRL's default): (-3/4 - 4/4) / 2
    assert _policy_loss() == pytest.approx(-0.875)


def test_the_critic_divides_each_sequence_sum_by_loss_scale_factor():
    cfg = CriticConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=8, cliprange_value=100.0)
    values = torch.zeros(2, 4)
    mb = DataProto.from_dict({"response_mask": MASK, "values": values,
                              "returns": torch.tensor([[1.0] * 4, [2.0] * 4])})
    metrics = MetricAccumulator(torch.device("cpu"))
    loss = compose_value_loss(cfg, mb, values.clone(), COUNTS, metrics)
    # 0.5 × squared errors: sequence sums 3 × 1 and 2 × 4; 0.5 × (3/8 + 8/8) / 2
    assert float(loss) == pytest.approx(0.34375)


def _config(*overrides: str) -> PPOConfig:
    base = ["data.train_batch_size=16", "actor_rollout_ref.rollout.n=4", "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "algorithm.adv_estimator=gae"]
    return build(PPOConfig, to_container(load_yaml(overrides=[*base, *overrides])))


def test_the_critic_inherits_the_actors_factor_and_may_set_its_own():
    cfg = _config("actor_rollout_ref.actor.loss_scale_factor=512")
    assert (cfg.actor_rollout_ref.actor.loss_scale_factor, cfg.critic.loss_scale_factor) == (512, 512)
    cfg = _config("actor_rollout_ref.actor.loss_scale_factor=512", "critic.loss_scale_factor=64")
    assert cfg.critic.loss_scale_factor == 64
    assert dataclasses.asdict(_config())["critic"]["loss_scale_factor"] is None


def test_a_factor_that_is_not_positive_is_refused_naming_the_key():
    with pytest.raises(ConfigError) as info:
        validate(_config("actor_rollout_ref.actor.loss_scale_factor=0"), check_files=False)
    assert "actor_rollout_ref.actor.loss_scale_factor=0 is out of range: it must be > 0" in str(info.value)


def test_a_factor_under_another_mode_is_said_to_do_nothing():
    warnings = validate(_config("actor_rollout_ref.actor.loss_scale_factor=512"), check_files=False)
    assert any("actor_rollout_ref.actor.loss_scale_factor=512 has no effect with "
               "actor_rollout_ref.actor.loss_agg_mode=token-mean" in w for w in warnings)
    assert not any("critic.loss_scale_factor" in w for w in warnings)  # inherited, named once on the actor
    warnings = validate(_config("actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-sum-norm",
                                "actor_rollout_ref.actor.loss_scale_factor=512", "critic.loss_agg_mode=token-mean",
                                "critic.loss_scale_factor=64"), check_files=False)
    assert [w for w in warnings if "loss_scale_factor" in w] == [
        "critic.loss_scale_factor=64 has no effect with critic.loss_agg_mode=token-mean: it divides "
        "seq-mean-token-sum-norm's sequence sums only; set loss_agg_mode=seq-mean-token-sum-norm or remove it"]
