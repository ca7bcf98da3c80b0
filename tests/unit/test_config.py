"""Config loading and validation: every error names the offending keys and values."""

from __future__ import annotations

import pytest

from verlx.config.loader import ConfigError, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer.preflight import validate

# Command lines in the style veRL users write (veRL's key names, micro-batch sizes set by hand), our own values.
VERL_STYLE_PPO = [
    "algorithm.adv_estimator=gae",
    "data.train_files=/data/gsm8k/train.parquet",
    "data.val_files=/data/gsm8k/test.parquet",
    "data.train_batch_size=128",
    "data.max_prompt_length=384",
    "data.max_response_length=640",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct",
    "actor_rollout_ref.actor.optim.lr=2e-6",
    "actor_rollout_ref.actor.ppo_mini_batch_size=32",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
    "actor_rollout_ref.rollout.name=sglang",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.5",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
    "critic.model.path=Qwen/Qwen2.5-1.5B-Instruct",
    "critic.optim.lr=5e-6",
    "critic.ppo_micro_batch_size_per_gpu=8",
    "algorithm.kl_ctrl.kl_coef=0.002",
    "trainer.logger=console",
    "trainer.val_before_train=True",
    "trainer.n_gpus_per_node=4",
    "trainer.nnodes=1",
    "trainer.save_freq=25",
    "trainer.test_freq=25",
    "trainer.total_epochs=3",
]

VERL_STYLE_GRPO = [
    "algorithm.adv_estimator=grpo",
    "algorithm.use_kl_in_reward=False",
    "data.train_files=/data/math/train.parquet",
    "data.val_files=/data/math/test.parquet",
    "data.train_batch_size=512",
    "data.max_prompt_length=768",
    "data.max_response_length=2048",
    "data.filter_overlong_prompts=True",
    "data.truncation='error'",
    "actor_rollout_ref.model.path=Qwen/Qwen2.5-7B-Instruct",
    "actor_rollout_ref.model.use_remove_padding=True",
    "actor_rollout_ref.model.enable_gradient_checkpointing=True",
    "actor_rollout_ref.actor.optim.lr=5e-7",
    "actor_rollout_ref.actor.ppo_mini_batch_size=128",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
    "actor_rollout_ref.actor.use_kl_loss=True",
    "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
    "actor_rollout_ref.actor.kl_loss_coef=0.005",
    "actor_rollout_ref.actor.entropy_coeff=0",
    "actor_rollout_ref.actor.fsdp_config.param_offload=False",
    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.rollout.n=8",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
    "actor_rollout_ref.rollout.gpu_memory_utilization=0.55",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
    "trainer.critic_warmup=0",
    "trainer.logger=[\"console\"]",
    "trainer.project_name='gsm8k_grpo'",
    "trainer.experiment_name='qwen2_5_7b'",
    "trainer.n_gpus_per_node=8",
    "trainer.nnodes=2",
    "trainer.save_freq=40",
    "trainer.test_freq=10",
    "trainer.total_epochs=4",
]


def config_from(overrides) -> PPOConfig:
    return build(PPOConfig, to_container(load_yaml(overrides=overrides)))


@pytest.mark.parametrize("overrides", [VERL_STYLE_PPO, VERL_STYLE_GRPO], ids=["verl-style-ppo", "verl-style-grpo"])
def test_verl_command_lines_are_accepted_unchanged(overrides):
    cfg = config_from(overrides)
    assert validate(cfg, check_files=False) is not None


def test_yaml_defaults_match_dataclass_defaults():
    """The YAML is what users read; the dataclasses must not silently disagree with it."""
    import dataclasses

    loaded = dataclasses.asdict(config_from([]))
    defaults = dataclasses.asdict(PPOConfig())
    interpolated = {  # keys whose YAML value is an interpolation of another key
        "actor_rollout_ref.rollout.prompt_length", "actor_rollout_ref.rollout.response_length",
        "trainer.default_local_dir", "trainer.output_dir", "reward_model.model.input_tokenizer",
        *(f"{role}.profiler.save_path" for role in ("actor_rollout_ref.actor", "actor_rollout_ref.ref",
                                                   "actor_rollout_ref.rollout", "critic", "reward_model")),
    }

    def walk(a, b, path=""):
        for k in a:
            p = f"{path}.{k}" if path else k
            if isinstance(a[k], dict) and isinstance(b.get(k), dict) and k not in ("override_config",):
                walk(a[k], b[k], p)
            elif p not in interpolated:
                assert a[k] == b[k], f"{p}: yaml {a[k]!r} != dataclass {b[k]!r}"

    walk(loaded, defaults)


def test_unknown_override_suggests_the_key():
    with pytest.raises(ConfigError) as info:
        load_yaml(overrides=["actor_rollout_ref.actor.ppo_mini_bach_size=3", "trainer.n_gpu_per_node=2"])
    text = str(info.value)
    assert "unknown key 'actor_rollout_ref.actor.ppo_mini_bach_size'. Did you mean 'ppo_mini_batch_size'?" in text
    assert "unknown key 'trainer.n_gpu_per_node'. Did you mean 'n_gpus_per_node'?" in text


def test_a_key_in_the_wrong_section_is_pointed_to_where_it_is():
    with pytest.raises(ConfigError) as info:
        load_yaml(overrides=["+trainer.adv_estimator=grpo", "reward.lr=1", "trainer.foo=1"])
    text = "\n".join(info.value.problems)
    assert "'adv_estimator' is at algorithm.adv_estimator: did you mean algorithm.adv_estimator=...?" in text
    assert ("'lr' is at actor_rollout_ref.actor.optim.lr and critic.optim.lr: did you mean "
            "actor_rollout_ref.actor.optim.lr=...?") in text
    assert "unknown key 'trainer.foo'. It is no key of verlx" in text


def test_free_form_sections_accept_any_key():
    load_yaml(overrides=["+actor_rollout_ref.rollout.engine_kwargs.vllm.swap_space=4",
                         "+custom_reward_function.reward_kwargs.strict=true"])


def test_unknown_key_in_a_yaml_section_and_wrong_types():
    with pytest.raises(ConfigError) as info:
        build(PPOConfig, {"data": {"train_batch_size": "many", "max_prompt_lenght": 3},
                          "trainer": {"nnodes": 1.5}})
    problems = info.value.problems
    assert "'data.train_batch_size' = 'many' must be int" in problems
    assert any("unknown key 'data.max_prompt_lenght'. Did you mean 'max_prompt_length'?" in p for p in problems)
    assert "'trainer.nnodes' = 1.5 must be int" in problems


def _arith(**over) -> PPOConfig:
    base = {"data.train_batch_size": 16, "actor_rollout_ref.rollout.n": 4, "trainer.n_gpus_per_node": 2,
            "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4,
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": 8,
            "critic.ppo_micro_batch_size_per_gpu": 4, "algorithm.adv_estimator": "grpo"}
    base.update(over)
    return config_from([f"{k}={v}" for k, v in base.items()])


def test_valid_batch_arithmetic_passes():
    validate(_arith(), check_files=False)


def test_mini_batch_not_dividing_train_batch_names_both_keys():
    with pytest.raises(ConfigError) as info:
        validate(_arith(**{"actor_rollout_ref.actor.ppo_mini_batch_size": 6}), check_files=False)
    text = str(info.value)
    assert "data.train_batch_size=16 is not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=6" in text
    assert "mini-batch sizes that work: 4, 8" in text


def test_micro_batch_not_dividing_per_gpu_share():
    # mini 8 prompts × n 4 = 32 samples over 2 ranks = 16 per GPU; 5 does not divide 16
    with pytest.raises(ConfigError) as info:
        validate(_arith(**{"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 5}), check_files=False)
    text = str(info.value)
    assert "ppo_micro_batch_size_per_gpu=5 does not divide the 16 samples each GPU gets" in text
    assert "values that work: 4, 2, 8, 1" in text  # divisors of 16 nearest to 5


def test_samples_not_splitting_over_workers():
    # 3 prompts × n 1 = 3 samples over 2 workers
    with pytest.raises(ConfigError, match=r"3×1 = 3 samples do not split evenly over 2 workers"):
        validate(_arith(**{"data.train_batch_size": 3, "actor_rollout_ref.rollout.n": 1,
                           "actor_rollout_ref.actor.ppo_mini_batch_size": 3}), check_files=False)


def test_missing_micro_batch_size_is_named_when_dynamic_batches_are_switched_off():
    with pytest.raises(ConfigError, match="actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is not set"):
        validate(_arith(**{"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "null",
                           "actor_rollout_ref.actor.use_dynamic_bsz": "false"}), check_files=False)


def test_without_micro_batch_sizes_the_default_is_token_budget_batches():
    """use_dynamic_bsz null: token-budget micro-batches unless a micro-batch size is set (then fixed, as in veRL)."""
    from verlx.workers.auto_settings import dynamic_phases

    cfg = _arith(**{"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": "null",
                    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu": "null"})
    validate(cfg, check_files=False)
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is None
    assert [(key.rsplit(".", 2)[-2], dynamic) for key, _, dynamic in dynamic_phases(cfg)] == [
        ("actor", True), ("rollout", True)]
    fixed = dynamic_phases(_arith())  # the micro-batch sizes of _arith are set
    assert [dynamic for _, _, dynamic in fixed] == [False, False]


def test_verls_clip_ratio_low_of_one_or_more_means_no_lower_clip():
    validate(_arith(**{"actor_rollout_ref.actor.clip_ratio_low": 10.0,
                       "actor_rollout_ref.actor.policy_loss.loss_mode": "cispo"}), check_files=False)
    with pytest.raises(ConfigError, match=r"clip_ratio_low=-0.1 must be >= 0"):
        validate(_arith(**{"actor_rollout_ref.actor.clip_ratio_low": -0.1}), check_files=False)


def test_filter_groups_metric_may_be_null_while_dynamic_sampling_is_off():
    validate(_arith(**{"algorithm.filter_groups.metric": "null"}), check_files=False)
    with pytest.raises(ConfigError, match=r"filter_groups.enable=true needs algorithm.filter_groups.metric"):
        validate(_arith(**{"algorithm.filter_groups.metric": "null", "algorithm.filter_groups.enable": "true"}),
                 check_files=False)


def test_tensor_parallel_must_divide_world():
    with pytest.raises(ConfigError, match="tensor_model_parallel_size=4 must divide the world size 2"):
        validate(_arith(**{"actor_rollout_ref.rollout.tensor_model_parallel_size": 4}), check_files=False)


def test_unknown_names_list_registered_ones():
    with pytest.raises(ConfigError) as info:
        validate(_arith(**{"algorithm.adv_estimator": "grpoo",
                           "actor_rollout_ref.actor.policy_loss.loss_mode": "gspoo",
                           "actor_rollout_ref.rollout.name": "vlm"}), check_files=False)
    text = str(info.value)
    assert "algorithm.adv_estimator: unknown advantage estimator 'grpoo'" in text and "Did you mean 'grpo'" in text
    assert "unknown policy loss 'gspoo'" in text and "vanilla" in text
    assert "unknown rollout engine 'vlm'" in text and "Did you mean 'vllm'" in text


def test_critic_estimator_without_critic():
    with pytest.raises(ConfigError, match="adv_estimator=gae needs a critic but critic.enable=false"):
        validate(_arith(**{"algorithm.adv_estimator": "gae", "critic.enable": "false"}), check_files=False)


def test_grpo_with_one_sample_warns():
    warnings = validate(_arith(**{"actor_rollout_ref.rollout.n": 1, "data.train_batch_size": 16,
                                  "actor_rollout_ref.actor.ppo_mini_batch_size": 8,
                                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": 4}), check_files=False)
    assert any("every advantage is 0" in w for w in warnings)


def test_missing_files_are_named(tmp_path):
    cfg = _arith(**{"data.train_files": str(tmp_path / "nope.parquet"), "data.val_files": "null",
                    "actor_rollout_ref.model.path": str(tmp_path / "no-model")})
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    text = str(info.value)
    assert f"data.train_files: file '{tmp_path / 'nope.parquet'}' does not exist" in text
    assert "actor_rollout_ref.model.path: directory" in text


@pytest.mark.parametrize("steps", [0, -3])
def test_total_training_steps_zero_or_negative_is_an_error_not_the_epoch_count(steps):
    with pytest.raises(ConfigError) as info:
        validate(_arith(**{"trainer.total_training_steps": steps}), check_files=False)
    assert (f"trainer.total_training_steps={steps} must be positive; use null to train for trainer.total_epochs "
            "(30)") in str(info.value)


def test_total_epochs_must_be_positive_when_steps_come_from_epochs():
    with pytest.raises(ConfigError, match=r"trainer.total_epochs=0 must be positive when "
                                          r"trainer.total_training_steps is null"):
        validate(_arith(**{"trainer.total_epochs": 0}), check_files=False)
    validate(_arith(**{"trainer.total_epochs": 0, "trainer.total_training_steps": 5}), check_files=False)
