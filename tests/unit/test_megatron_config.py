"""ppo_megatron_trainer.yaml and the megatron config checks that run before Ray starts."""

from __future__ import annotations

import json

import pytest

from verlx.config.loader import Findings, build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.trainer.entrypoint import override_args
from verlx.trainer.preflight import check_batch_arithmetic
from verlx.workers.engine import engine_class
from verlx.workers.megatron import INSTALL_COMMAND, MegatronNotInstalled, megatron_core_available
from verlx.workers.megatron.config_checks import megatron_problems

BASE = ["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
        "trainer.n_gpus_per_node=8", "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2"]


def _model_dir(tmp_path, arch="Qwen2ForCausalLM", heads=8, kv=4, layers=8) -> str:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({"architectures": [arch], "num_attention_heads": heads,
                                               "num_key_value_heads": kv, "num_hidden_layers": layers}))
    return str(d)


def _config(tmp_path, *overrides, **model) -> PPOConfig:
    path = _model_dir(tmp_path, **model)
    return build(PPOConfig, to_container(load_yaml("ppo_megatron_trainer",
                                                   [*BASE, f"actor_rollout_ref.model.path={path}", *overrides])))


def test_yaml_shares_everything_but_the_engine():
    cfg = build(PPOConfig, to_container(load_yaml("ppo_megatron_trainer")))
    base = build(PPOConfig, to_container(load_yaml("ppo_trainer")))
    arr = cfg.actor_rollout_ref
    assert arr.actor.strategy == cfg.critic.strategy == arr.ref.strategy == "megatron"
    assert cfg.data == base.data and cfg.algorithm == base.algorithm and cfg.trainer == base.trainer
    tuned = build(PPOConfig, to_container(load_yaml("ppo_megatron_trainer", [
        "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2"])))
    assert tuned.critic.megatron.pipeline_model_parallel_size == 2  # critic and ref follow the actor's layout
    assert tuned.actor_rollout_ref.ref.megatron.pipeline_model_parallel_size == 2


def test_missing_megatron_core_names_the_install_command(tmp_path):
    problems = megatron_problems(_config(tmp_path), 8, megatron_installed=False)
    assert problems == [f"strategy=megatron needs megatron-core, which is not installed; install it with: "
                        f"{INSTALL_COMMAND}"]
    assert INSTALL_COMMAND == "pip install 'verlx[megatron]'"


def test_layout_problems_are_reported_before_ray(tmp_path):
    cfg = _config(tmp_path, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=3")
    text = "\n".join(megatron_problems(cfg, 8, True))
    assert "3×1×1 = 3 does not divide the world size 8" in text
    assert "tensor_model_parallel_size=3 does not divide the model's num_attention_heads=8" in text
    cfg = _config(tmp_path, "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=3", layers=8)
    assert any("num_hidden_layers=8 do not split evenly" in p for p in megatron_problems(cfg, 8, True))


def test_unsupported_architecture_and_mixed_backends(tmp_path):
    cfg = _config(tmp_path, arch="GemmaForCausalLM")
    problems = megatron_problems(cfg, 8, True)
    assert any("is a GemmaForCausalLM: verlx's megatron engine does not support that architecture yet (no "
               "converter); it supports LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM" in p for p in problems)
    mixed = _config(tmp_path, "critic.strategy=fsdp", "algorithm.adv_estimator=gae")
    assert any("colocated roles must use the same backend" in p for p in megatron_problems(mixed, 8, True))


def test_valid_layout_passes_and_batch_arithmetic_uses_megatron_dp(tmp_path):
    ok = _config(tmp_path, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                 "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2")
    assert megatron_problems(ok, 8, True) == []
    found = Findings()
    check_batch_arithmetic(ok, found, 8)  # dp = 8 / (2·2) = 2: mini-batch 4×2 = 8 samples → 4 per rank, micro 2
    assert found.problems == []
    bad = _config(tmp_path, "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3")
    found = Findings()
    check_batch_arithmetic(bad, found, 8)  # dp = 8 / 2 = 4: 4×2 / 4 = 2 samples per rank
    assert any("ppo_micro_batch_size_per_gpu=3 does not divide the 2 samples" in p for p in found.problems)


def test_strategy_registry_and_command_line():
    if megatron_core_available():  # the one actor and critic worker run it as their training engine
        assert engine_class("megatron").__name__ == "MegatronEngine"
    else:
        with pytest.raises(MegatronNotInstalled, match=r"pip install 'verlx\[megatron\]'"):
            engine_class("megatron")
    with pytest.raises(KeyError, match="Did you mean 'megatron'"):
        engine_class("megatronn")
    assert override_args(["--config-name", "ppo_megatron_trainer", "trainer.nnodes=1"]) == ["trainer.nnodes=1"]


def test_exact_kl_needs_fsdp(tmp_path):
    full = _config(tmp_path, "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_type=full",
                   "algorithm.use_kl_in_reward=true", "algorithm.kl_penalty=full")
    assert [p for p in megatron_problems(full, 8, True) if "exact KL" in p] == [
        "actor_rollout_ref.actor.kl_loss_type=full (the exact KL over the full vocabulary) needs "
        "actor_rollout_ref.actor.strategy=fsdp; the megatron engine computes KLs from sampled tokens: use low_var_kl, "
        "kl, mse or abs",
        "algorithm.kl_penalty=full (the exact KL over the full vocabulary) needs "
        "actor_rollout_ref.actor.strategy=fsdp; the megatron engine computes KLs from sampled tokens: use "
        "low_var_kl, kl, mse or abs"]
    sampled = _config(tmp_path, "actor_rollout_ref.actor.use_kl_loss=true", "algorithm.kl_penalty=full")
    assert megatron_problems(sampled, 8, True) == []  # kl_penalty only matters with use_kl_in_reward


M = "actor_rollout_ref.actor.megatron"
OPT = "actor_rollout_ref.actor.optim"


def _refused(tmp_path, monkeypatch, *overrides, te: bool = False, **model) -> str:
    """Every problem validation (the pre-Ray checks main_ppo runs) reports, with transformer-engine present or not."""
    import verlx.workers.megatron.config_checks as checks
    from verlx.config.loader import ConfigError
    from verlx.trainer.preflight import validate

    monkeypatch.setattr(checks, "transformer_engine_available", lambda: te)
    with pytest.raises(ConfigError) as info:
        validate(_config(tmp_path, *overrides, **model), world_size=8, check_files=False)
    return str(info.value)


@pytest.mark.skipif(not megatron_core_available(), reason="the override fields are megatron-core's dataclasses'")
def test_keys_that_need_transformer_engine_are_refused_before_ray(tmp_path, monkeypatch):
    text = _refused(tmp_path, monkeypatch, f"{M}.use_transformer_engine=true",
                    f"+{M}.override_transformer_config.moe_grouped_gemm=true",
                    f"+{M}.override_transformer_config.gradient_accumulation_fusion=true",
                    f"+{OPT}.override_optimizer_config.use_precision_aware_optimizer=true")
    assert f"{M}.use_transformer_engine=true but transformer-engine is not installed" in text
    assert (f"{M}.override_transformer_config.moe_grouped_gemm=True needs transformer-engine (grouped expert GEMMs), "
            "which is not installed") in text
    assert f"{M}.override_transformer_config.gradient_accumulation_fusion=True needs transformer-engine" in text
    assert f"{OPT}.override_optimizer_config.use_precision_aware_optimizer=true needs transformer-engine's" in text
    # with transformer-engine installed the same keys pass these checks
    ok = _config(tmp_path, f"+{M}.override_transformer_config.moe_grouped_gemm=true")
    import verlx.workers.megatron.config_checks as checks

    monkeypatch.setattr(checks, "transformer_engine_available", lambda: True)
    assert megatron_problems(ok, 8, True) == []


@pytest.mark.skipif(not megatron_core_available(), reason="the override fields are megatron-core's dataclasses'")
def test_override_keys_verlx_sets_splits_it_cannot_make_and_typos(tmp_path, monkeypatch):
    text = _refused(tmp_path, monkeypatch, f"+{M}.override_transformer_config.num_layers=4",
                    f"+{M}.override_transformer_config.num_layers_in_first_pipeline_stage=2",
                    f"+{M}.override_transformer_config.account_for_loss_in_pipeline_split=true",
                    f"+{M}.override_transformer_config.recompute_granularty=full",
                    f"+{M}.override_ddp_config.use_distributed_optimizer=false",
                    f"+{OPT}.override_optimizer_config.adam_epss=1e-6", f"{M}.context_parallel_size=2")
    assert f"{M}.override_transformer_config.num_layers: verlx sets it from the model's HF config" in text
    assert "num_layers_in_first_pipeline_stage=2 needs pipeline_model_parallel_size >= 2 (got 1)" in text
    assert ("account_for_loss_in_pipeline_split=True: verlx splits the layers over pipeline stages evenly or by "
            "num_layers_in_first/last_pipeline_stage only") in text
    assert ("recompute_granularty is not a megatron TransformerConfig field. Did you mean "
            "'recompute_granularity'") in text
    assert f"{M}.override_ddp_config.use_distributed_optimizer: set {M}.use_distributed_optimizer instead" in text
    assert "adam_epss is not a megatron OptimizerConfig field. Did you mean 'adam_eps'" in text
    assert f"{M}.context_parallel_size=2: verlx's megatron backend does not split sequences" in text


def test_lr_schedule_keys_are_checked_and_fsdp_refuses_them(tmp_path, monkeypatch):
    text = _refused(tmp_path, monkeypatch, f"{OPT}.lr_decay_style=WSD", f"{OPT}.min_lr=1.0",
                    f"{OPT}.lr_scheduler_type=cosine", f"{M}.use_dist_checkpointing=true")
    assert f"{OPT}.lr_decay_style=WSD needs {OPT}.lr_wsd_decay_steps" in text
    assert f"{OPT}.min_lr=1.0 must lie between 0 and {OPT}.lr=1e-06" in text
    assert f"{OPT}.lr_scheduler_type=cosine and {OPT}.lr_decay_style=WSD both set a schedule" in text
    assert f"{M}.use_dist_checkpointing=true needs {M}.dist_checkpointing_path" in text
    from verlx.config.loader import ConfigError
    from verlx.trainer.preflight import validate

    fsdp = build(PPOConfig, to_container(load_yaml("ppo_trainer", [*BASE, f"+{OPT}.lr_decay_style=cosine"])))
    with pytest.raises(ConfigError, match=f"{OPT}.lr_decay_style='cosine' is a megatron optimizer key .* but the "
                       "role's strategy is fsdp"):
        validate(fsdp, world_size=8, check_files=False)


def test_veRL_bridge_switches_and_expert_sizes_on_a_dense_model(tmp_path):
    cfg = _config(tmp_path, f"{M}.use_mbridge=false", f"{M}.vanilla_mbridge=true",
                  f"{M}.expert_model_parallel_size=2", f"{M}.expert_tensor_parallel_size=1")
    from verlx.workers.megatron.config_checks import megatron_findings

    found = megatron_findings(cfg, 8, True)
    assert found.problems == []
    assert found.warnings == [f"{M}.expert_model_parallel_size=2 / expert_tensor_parallel_size=1: the model has no "
                              "experts, so they have no effect"]  # GRPO without a KL loss: no reference


def test_tensor_parallel_groups_must_not_straddle_nodes(tmp_path):
    """8 GPUs as 4 nodes × 2: megatron TP=4 divides the world but not a node; so does the rollout's TP=4."""
    from verlx.config.loader import ConfigError
    from verlx.trainer.preflight import validate

    cfg = _config(tmp_path, "trainer.nnodes=4", "trainer.n_gpus_per_node=2", f"{M}.tensor_model_parallel_size=4",
                  "actor_rollout_ref.rollout.tensor_model_parallel_size=4", heads=8, kv=4)
    assert f"{M}.tensor_model_parallel_size=4 does not divide trainer.n_gpus_per_node=2: tensor-parallel groups " \
           "would straddle nodes" in "\n".join(megatron_problems(cfg, 8, True))
    # the rollout engines' TP groups, checked before Ray now (the workers' engine layout refused them after it)
    with pytest.raises(ConfigError, match="rollout.tensor_model_parallel_size=4 does not divide "
                       "trainer.n_gpus_per_node=6, so some tensor-parallel groups would straddle two nodes"):
        validate(_config(tmp_path, "trainer.nnodes=2", "trainer.n_gpus_per_node=6", "data.train_batch_size=12",
                         "actor_rollout_ref.rollout.tensor_model_parallel_size=4"), world_size=12, check_files=False)
    ok = _config(tmp_path, "trainer.nnodes=4", "trainer.n_gpus_per_node=2", f"{M}.tensor_model_parallel_size=2")
    assert megatron_problems(ok, 8, True) == []


def test_expert_sizes_are_checked_against_a_mixture_of_experts_model(tmp_path, monkeypatch):
    import verlx.workers.megatron.config_checks as checks

    model = tmp_path / "moe"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3MoeForCausalLM"], "num_attention_heads": 8, "num_key_value_heads": 4,
        "num_hidden_layers": 8, "num_experts": 6, "moe_intermediate_size": 30}))
    cfg = build(PPOConfig, to_container(load_yaml("ppo_megatron_trainer", [
        *BASE, f"actor_rollout_ref.model.path={model}", f"{M}.expert_model_parallel_size=4",
        f"{M}.expert_tensor_parallel_size=4"])))
    monkeypatch.setattr(checks, "transformer_engine_available", lambda: True)
    text = "\n".join(megatron_problems(cfg, 8, True))
    assert f"{M}.expert_model_parallel_size=4 does not divide the model's 6 experts" in text
    assert "expert_tensor_parallel_size × expert_model_parallel_size × pipeline_model_parallel_size = 4×4×1 = 16 " \
           "does not divide the world size 8" in text
    assert f"{M}.expert_tensor_parallel_size=4 does not divide the model's moe_intermediate_size=30" in text
    assert f"{M}: the model is a mixture of experts, which verlx converts for megatron's local layers only" in text
    ok = build(PPOConfig, to_container(load_yaml("ppo_megatron_trainer", [
        *BASE, f"actor_rollout_ref.model.path={model}", f"{M}.expert_model_parallel_size=2",
        f"{M}.use_transformer_engine=false"])))
    assert megatron_problems(ok, 8, True) == []
