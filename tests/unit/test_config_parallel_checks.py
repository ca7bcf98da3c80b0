"""Config-time checks of Ulysses sequence parallelism and dynamic-batch token budgets (before Ray starts)."""

from __future__ import annotations

import json

import pytest

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer.preflight import validate


def _cfg(**over) -> PPOConfig:
    base = {"data.train_batch_size": 16, "actor_rollout_ref.rollout.n": 4, "trainer.n_gpus_per_node": 4,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
            "critic.ppo_micro_batch_size_per_gpu": 4, "algorithm.adv_estimator": "grpo",
            "data.max_prompt_length": 512, "data.max_response_length": 1024}
    base.update(over)
    return build(PPOConfig, to_container(load_yaml(overrides=[f"{k}={v}" for k, v in base.items()])))


def _problems(cfg) -> str:
    with pytest.raises(ConfigError) as info:
        validate(cfg, check_files=False)
    return str(info.value)


def _model_dir(tmp_path, heads: int, kv_heads: int) -> str:
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "qwen2", "num_attention_heads": heads, "num_key_value_heads": kv_heads, "hidden_size": 64}))
    return str(tmp_path)


def test_ulysses_needs_remove_padding():
    text = _problems(_cfg(**{"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2,
                             "actor_rollout_ref.model.use_remove_padding": "false"}))
    assert ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2 needs "
            "actor_rollout_ref.model.use_remove_padding=true") in text


def test_ulysses_must_divide_the_heads_of_config_json(tmp_path):
    # 6 heads over SP 4 (world 4): sizes that divide both 6 and 4 are 1 and 2
    model = _model_dir(tmp_path, heads=6, kv_heads=2)
    text = _problems(_cfg(**{"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 4,
                             "actor_rollout_ref.model.path": model}))
    assert ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 must divide the number of attention heads (6); "
            "sizes that work: [1, 2]") in text
    assert f"(from {model}/config.json)" in text


def test_ulysses_kv_heads_rule_and_the_critic(tmp_path):
    # 12 heads, 3 KV heads, SP 2: 3 KV heads neither split over 2 ranks nor replicate evenly onto them
    model = _model_dir(tmp_path, heads=12, kv_heads=3)
    text = _problems(_cfg(**{"critic.ulysses_sequence_parallel_size": 2, "algorithm.adv_estimator": "gae",
                             "actor_rollout_ref.model.path": model}))
    assert "critic.ulysses_sequence_parallel_size=2 and the 3 key/value heads" in text
    # the same model with 4 KV heads at SP 4 passes (one KV head per rank)
    _model_dir(tmp_path, heads=12, kv_heads=4)
    validate(_cfg(**{"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 4,
                     "actor_rollout_ref.model.path": model}), check_files=False)


def test_ulysses_must_divide_the_heads_of_a_distillation_teacher(tmp_path):
    # the student's 8 heads split over SP 4; the teacher's 6 do not, and it runs in the actor's SP groups
    student, teacher = tmp_path / "student", tmp_path / "teacher"
    student.mkdir(), teacher.mkdir()
    over = {"actor_rollout_ref.actor.ulysses_sequence_parallel_size": 4,
            "actor_rollout_ref.model.path": _model_dir(student, heads=8, kv_heads=4),
            "distillation.enabled": "true", "distillation.distillation_loss.loss_mode": "k3",
            "distillation.teacher_models.teacher_model.model_path": _model_dir(teacher, heads=6, kv_heads=2)}
    text = _problems(_cfg(**over))
    assert ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=4 must divide the number of attention heads (6); "
            f"sizes that work: [1, 2] (from {teacher}/config.json)") in text
    _model_dir(teacher, heads=8, kv_heads=4)
    validate(_cfg(**over), check_files=False)


def test_reference_needs_the_actors_ulysses_size():
    text = _problems(_cfg(**{"actor_rollout_ref.actor.use_kl_loss": "true",
                             "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2,
                             "actor_rollout_ref.ref.ulysses_sequence_parallel_size": 1}))
    assert "actor_rollout_ref.ref.ulysses_sequence_parallel_size=1 differs from" in text


def test_token_budget_below_the_longest_sequence_is_an_error():
    cfg = _cfg(**{"actor_rollout_ref.actor.use_dynamic_bsz": "true",
                  "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 1500,
                  "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz": "true",
                  "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 1536})
    text = _problems(cfg)
    # 512 + 1024 = 1536: the training budget of 1500 is short, the log-prob budget of exactly 1536 is enough
    assert ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=1500 is smaller than the longest possible sequence, "
            "data.max_prompt_length + data.max_response_length = 512 + 1024 = 1536 tokens") in text
    assert "raise it to at least 1536" in text
    assert "log_prob_max_token_len_per_gpu" not in text


# veRL's per-GPU budgets under Ulysses: 2048 + 20480 = 22528-token sequences, 11264 tokens on each of 2 GPUs, for
# every dynamic-batch budget (actor, old and reference log-probs, critic update and values)
VERL_SP2 = {"data.max_prompt_length": 2048, "data.max_response_length": 20480, "algorithm.adv_estimator": "gae",
            "actor_rollout_ref.actor.use_kl_loss": "true", "actor_rollout_ref.actor.use_dynamic_bsz": "true",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size": 2, "critic.ulysses_sequence_parallel_size": 2,
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 11264,
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": 11264,
            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": 11264,
            "critic.ppo_max_token_len_per_gpu": 11264, "critic.forward_max_token_len_per_gpu": 11264}
BUDGET_KEYS = ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
               "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
               "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu",
               "critic.forward_max_token_len_per_gpu")


def test_verls_per_gpu_budgets_under_ulysses_are_accepted():
    """A budget × the Ulysses size holds the longest sequence: veRL runs it, so does verlx (each GPU holds at most
    11264 tokens of a 22528-token micro-batch)."""
    validate(_cfg(**VERL_SP2), check_files=False)


@pytest.mark.parametrize("key", BUDGET_KEYS)
def test_a_budget_times_the_ulysses_size_below_the_longest_sequence_is_refused(key):
    text = _problems(_cfg(**{**VERL_SP2, key: 11263}))
    assert (f"{key}=11263 lets a micro-batch hold 11263 × 2 = 22526 tokens (veRL's per-GPU budget: each of the 2 "
            "GPUs of the sequence-parallel group holds up to 11263 of them), fewer than the longest possible "
            "sequence, data.max_prompt_length + data.max_response_length = 2048 + 20480 = 22528 tokens; a "
            "micro-batch must hold at least one sequence, so raise it to at least 11264") in text
    assert sum(k in text for k in BUDGET_KEYS) == 1  # only the short one


def test_the_critics_budgets_scale_with_the_critics_ulysses_size():
    text = _problems(_cfg(**{**VERL_SP2, "critic.ulysses_sequence_parallel_size": 1}))
    assert ("critic.ppo_max_token_len_per_gpu=11264 is smaller than the longest possible sequence, "
            "data.max_prompt_length + data.max_response_length = 2048 + 20480 = 22528 tokens; a micro-batch must "
            "hold at least one sequence, so raise it to at least 22528") in text
    assert "critic.forward_max_token_len_per_gpu=11264 is smaller" in text
    assert "actor_rollout_ref" not in text


def test_token_budget_is_ignored_without_dynamic_batches_and_checked_for_the_critic():
    validate(_cfg(**{"actor_rollout_ref.actor.ppo_max_token_len_per_gpu": 100}), check_files=False)
    text = _problems(_cfg(**{"algorithm.adv_estimator": "gae", "critic.use_dynamic_bsz": "true",
                             "critic.forward_max_token_len_per_gpu": 1000}))
    assert "critic.forward_max_token_len_per_gpu=1000 is smaller" in text
    assert "critic.ppo_max_token_len_per_gpu" not in text  # its default 32768 holds 1536
