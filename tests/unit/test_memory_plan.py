"""The memory estimate behind the automatic settings, checked term by term against hand arithmetic for the
Qwen2.5-0.5B and 1.5B shapes, and the decisions it leads to (token budgets, gradient checkpointing, errors)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import Qwen2Config

from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.utils import memory_estimate as me
from verlx.workers import auto_settings
from verlx.workers.memory_plan import GpuMemory, MemoryPlanError

GIB = 2**30
QWEN_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True)
QWEN_15B = dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                intermediate_size=8960, vocab_size=151936, tie_word_embeddings=True)


def shape(fields) -> me.ModelShape:
    return me.ModelShape.from_hf_config(Qwen2Config(**fields))


def test_parameter_counts_of_the_qwen_shapes():
    s = shape(QWEN_05B)
    # layer: q 896×896+896, k and v 896×128+128 each, o 896×896, MLP 3×896×4864, two norms 2×896
    assert s.layer_parameters == 803_712 + 2 * 114_816 + 802_816 + 13_074_432 + 1_792 == 14_912_384
    # root: the tied embedding 151936×896 and the final norm
    assert s.root_parameters == 136_134_656 + 896
    assert s.parameters == 24 * 14_912_384 + 136_135_552 == 494_032_768  # Qwen2.5-0.5B's published count
    # 1.5B: layer 1536×1536+1536 + 2×(1536×256+256) + 1536×1536 + 3×1536×8960 + 2×1536
    assert shape(QWEN_15B).parameters == 28 * 46_797_824 + 151936 * 1536 + 1536 == 1_543_714_304
    assert me.ModelShape.from_hf_config(Qwen2Config(**QWEN_05B), parameters=123).parameters == 123


def test_activation_bytes_per_token_of_the_05b_shape():
    s = shape(QWEN_05B)
    attention = 2 * (896 + 2 * 128) + 2 * 896 + 4 * 14  # q, k, v, output in bf16; fp32 log-sum-exp per head
    assert attention == 4152
    assert me.layer_activation_bytes(s, compiled=False) == 2 * (4 * 896 + 2 * 896 + 4) + 4 * 896 + 4152 + 8 * 4864
    assert me.layer_activation_bytes(s, compiled=False) == 57_408
    # compiled: bf16 norm inputs and outputs with the fp32 rstd; gate, up and their product
    assert me.layer_activation_bytes(s, compiled=True) == 2 * (2 * 896 + 2 * 896 + 4) + 4152 + 6 * 4864 == 40_512
    assert me.head_activation_bytes(s, compiled=True) == (2 * 896 + 4) + 2 * 896 + 20 == 3_608
    # every layer keeps 40,512 B; one layer's eager tensors again for the gradients in flight; the head
    assert me.training_activation_bytes(s, checkpointing=False, compiled=True) == 24 * 40_512 + 57_408 + 3_608
    assert me.training_activation_bytes(s, checkpointing=False, compiled=True) == 1_033_304  # 0.99 MiB/token
    # checkpointing: each layer keeps its bf16 input (2 × 896), one layer is recomputed at a time
    assert me.training_activation_bytes(s, checkpointing=True, compiled=True) == 24 * 1_792 + 40_512 + 57_408 + 3_608
    assert me.forward_activation_bytes(s, compiled=True) == 57_408 + 3_608


def test_activation_bytes_per_token_of_the_15b_shape():
    s = shape(QWEN_15B)
    attention = 2 * (1536 + 2 * 256) + 2 * 1536 + 4 * 12
    assert attention == 7_216
    assert me.layer_activation_bytes(s, compiled=True) == 2 * (4 * 1536 + 4) + 7_216 + 6 * 8960 == 73_272
    assert me.layer_activation_bytes(s, compiled=False) == 2 * (6 * 1536 + 4) + 4 * 1536 + 7_216 + 8 * 8960
    assert me.layer_activation_bytes(s, compiled=False) == 103_480
    head = (2 * 1536 + 4) + 2 * 1536 + 20
    assert me.training_activation_bytes(s, checkpointing=False, compiled=True) == 28 * 73_272 + 103_480 + head


def test_logits_chunk_fsdp_working_set_and_model_state():
    s = shape(QWEN_05B)
    assert me.logits_chunk_bytes(s, 4096, compiled=True, training=True) == 4096 * 151936 * 4 == 2_489_319_424
    assert me.logits_chunk_bytes(s, 4096, compiled=False, training=True) == 4096 * 151936 * 12
    assert me.logits_chunk_bytes(s, 4096, compiled=True, training=False) == 4096 * 151936 * 2
    # gathered bf16 root and two layers; training adds bf16 + fp32 gradients of the root and one layer
    assert me.fsdp_working_bytes(s, training=False) == 2 * 136_135_552 + 4 * 14_912_384 == 331_920_640
    assert me.fsdp_working_bytes(s, training=True) == 331_920_640 + 6 * (136_135_552 + 14_912_384)
    actor = me.ModelState("actor", 494_032_768, param_bytes=4, trainable=True)
    assert actor.training_total == 16 * 494_032_768  # fp32 weights + fp32 gradients + Adam's two moments
    assert me.ModelState("actor", 10, param_bytes=4, trainable=True, shards=4).weights == 3 * 4  # ceil(10/4) × 4 B
    assert me.ModelState("ref", 494_032_768, param_bytes=2, trainable=False).training_total == 2 * 494_032_768
    with pytest.raises(ValueError, match="unknown dtype 'fp8'"):
        me.dtype_bytes("fp8")


def grpo_config(*extra) -> PPOConfig:
    """GRPO as the benchmarks run it: 64 prompts × 4 samples of 64 + 256 tokens, mini-batches of 32 prompts."""
    base = {"algorithm.adv_estimator": "grpo", "data.train_batch_size": "64", "data.max_prompt_length": "64",
            "data.max_response_length": "256", "actor_rollout_ref.rollout.n": "4", "trainer.n_gpus_per_node": "1",
            "actor_rollout_ref.actor.ppo_mini_batch_size": "32"}
    base.update(item.split("=", 1) for item in extra)
    return build(PPOConfig, to_container(load_yaml(overrides=[f"{k}={v}" for k, v in base.items()])))


# 24 and 32 GiB GPUs, 1 GiB held by others: usable = int(0.9 × 25,769,803,776) − 1,073,741,824 = 22,119,081,574
# and int(0.9 × 34,359,738,368) − 1,073,741,824 = 29,850,022,707
GPU_24 = GpuMemory(total=24 * GIB, held_by_others=GIB)
GPU_32 = GpuMemory(total=32 * GIB, held_by_others=GIB)
STATIC_05B = 16 * 494_032_768  # fp32 weights, gradients, Adam m and v
FSDP_05B = 331_920_640 + 6 * (136_135_552 + 14_912_384)
LOGITS_05B = 2_489_319_424


def plan(cfg, fields=QWEN_05B, memory=GPU_32):
    choices = auto_settings.actor_choices(cfg, dp=1)
    return choices, auto_settings.plan_role(cfg, "actor", shape(fields), memory, 1, choices)


def test_a_micro_batch_that_fits_keeps_checkpointing_off_and_gets_the_largest_budget():
    assert (GPU_24.usable, GPU_32.usable) == (22_119_081_574, 29_850_022_707)
    # mini-batch 8 prompts × 4 samples of at most 64 + 256 tokens: 10,240 tokens, under the 16,384 target
    choices, decision = plan(grpo_config("actor_rollout_ref.actor.ppo_mini_batch_size=8"))
    assert choices.target_tokens == 10_240
    # peak at 10,240 tokens without checkpointing: 7.90 + 1.24 + 2.49 + 10,240 × 1,033,304 B = 22.21 GB ≤ 29.85 GB
    assert STATIC_05B + FSDP_05B + LOGITS_05B + 10_240 * 1_033_304 == 22_213_084_928
    assert decision.checkpointing is False
    # (29,850,022,707 − 7,904,524,288 − 1,238,208,256 − 2,489,319,424) / 1,033,304 = 17,630.8 → 17,408 (× 256)
    assert decision.update_budget == 17_408
    # the log-prob phases hold the weights and Adam (no gradients): 61,016 B/token leaves more than the cap
    assert choices.forward_budget_keys == ["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"]
    assert decision.forward_budget == 65_536
    text = "; ".join(decision.notes)
    assert "gradient checkpointing auto → off (estimated peak without it 20.7 GiB ≤ usable 27.8 GiB" in text
    assert "actor_rollout_ref.actor.ppo_max_token_len_per_gpu auto → 17408" in text
    assert "activations 0.99 MiB/token with checkpointing off" in text


def test_a_micro_batch_that_does_not_fit_turns_checkpointing_on():
    # mini-batch 32 × 4 samples: the target is 16,384 tokens; 28.56 GB without checkpointing > 22.12 GB usable
    choices, decision = plan(grpo_config("actor_rollout_ref.actor.ppo_mini_batch_size=32"), memory=GPU_24)
    assert choices.target_tokens == 16_384
    assert STATIC_05B + FSDP_05B + LOGITS_05B + 16_384 * 1_033_304 == 28_561_704_704
    assert decision.checkpointing is True
    # with checkpointing 144,536 B/token: 10,487,029,606 / 144,536 = 72,556 tokens, capped at 32,768
    assert decision.update_budget == 32_768
    # the same micro-batch fits a 32 GiB GPU without checkpointing
    assert plan(grpo_config("actor_rollout_ref.actor.ppo_mini_batch_size=32"))[1].checkpointing is False


def test_explicit_settings_win():
    cfg = grpo_config("actor_rollout_ref.actor.ppo_mini_batch_size=32",
                      "actor_rollout_ref.model.enable_gradient_checkpointing=false",
                      "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=8192",
                      "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=4096")
    choices, decision = plan(cfg)
    assert choices.update_budget_key is None and choices.forward_budget_keys == []
    assert decision.checkpointing is False and decision.notes == []


def test_a_run_that_cannot_fit_even_with_checkpointing_and_offload_names_the_numbers():
    # 1.5B in fp32 with Adam: 16 × 1,543,714,304 B = 24.7 GB of state alone on a 16 GiB GPU
    with pytest.raises(MemoryPlanError) as info:
        plan(grpo_config(), fields=QWEN_15B, memory=GpuMemory(total=16 * GIB))
    text = str(info.value)
    assert "actor_rollout_ref.actor: the actor update cannot fit on this GPU even with gradient checkpointing" in text
    assert "weights+grads+optimizer 23.0 GiB over 1 GPU(s)" in text
    assert "usable 14.4 GiB = 0.9 × 16.0 GiB" in text and "fsdp_config.model_dtype=bf16" in text


def test_a_derived_budget_below_the_longest_sequence_is_an_error_naming_both_numbers():
    # checkpointing off by the user and 32k-token responses: 17,408 tokens fit, a sequence has 33,280
    cfg = grpo_config("data.max_response_length=33216", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
                      "actor_rollout_ref.actor.ppo_mini_batch_size=8")
    with pytest.raises(MemoryPlanError) as info:
        plan(cfg)
    assert ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu auto → 17408 tokens from the GPU's free memory with "
            "gradient checkpointing off, smaller than the longest sequence, data.max_prompt_length + "
            "data.max_response_length = 33280 tokens") in str(info.value)


def test_offloaded_models_are_not_counted_between_phases():
    cfg = grpo_config("actor_rollout_ref.actor.use_kl_loss=true")
    tenants = auto_settings.gpu_tenants(cfg, {"actor": 1000, "critic": 1000}, shards=1)
    # the update holds the actor's 16 B/param and the fp32 reference's 4 B/param
    assert auto_settings.resident_bytes(tenants, "actor", updating=True) == 16_000 + 4_000
    cfg = grpo_config("actor_rollout_ref.actor.use_kl_loss=true",
                      "actor_rollout_ref.ref.fsdp_config.param_offload=true",
                      "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")
    tenants = auto_settings.gpu_tenants(cfg, {"actor": 1000, "critic": 1000}, shards=1)
    assert auto_settings.resident_bytes(tenants, "actor", updating=True) == 16_000
    assert auto_settings.resident_bytes(tenants, "actor", updating=False) == 4_000  # Adam stays on the host
    assert auto_settings.resident_bytes(tenants, "ref", updating=False) == 4_000 + 4_000  # the actor's weights stay


def test_cpu_workers_use_the_documented_constants_and_log_each_choice(tmp_path):
    cfg = grpo_config()
    resolved, notes = auto_settings.resolve_actor_settings(cfg, Qwen2Config(**QWEN_05B), str(tmp_path),
                                                           torch.device("cpu"), world_size=1)
    arr = resolved.actor_rollout_ref
    assert arr.actor.use_dynamic_bsz is True and arr.rollout.log_prob_use_dynamic_bsz is True
    assert arr.actor.ppo_max_token_len_per_gpu == 16_384 == arr.rollout.log_prob_max_token_len_per_gpu
    assert arr.model.enable_gradient_checkpointing is False
    assert cfg.actor_rollout_ref.actor.use_dynamic_bsz is None  # the caller's config is left as it was
    assert notes[0] == "actor_rollout_ref.actor.use_dynamic_bsz auto → true (no micro-batch size set)"
    assert ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu, "
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu auto → 16384 "
            "(CPU run: a fixed budget, no memory estimate)") in notes
    assert "gradient checkpointing auto → off (CPU run)" in notes
    fixed, notes = auto_settings.resolve_actor_settings(
        grpo_config("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8"), Qwen2Config(**QWEN_05B),
        str(tmp_path), torch.device("cpu"), world_size=1)
    assert fixed.actor_rollout_ref.actor.use_dynamic_bsz is False
    assert ("actor_rollout_ref.actor.use_dynamic_bsz auto → false "
            "(actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is set)") in notes


def test_the_driver_rejects_a_run_that_cannot_fit_before_ray_starts(tmp_path, monkeypatch):
    from verlx.config.loader import ConfigError
    from verlx.trainer.preflight import validate
    from verlx.utils import gpu_info

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", **QWEN_15B}))
    cfg = grpo_config(f"actor_rollout_ref.model.path={tmp_path}")
    monkeypatch.setattr(gpu_info, "visible_gpu_total_bytes", lambda: 16 * GIB)
    with pytest.raises(ConfigError) as info:
        validate(cfg, check_files=False)
    assert "the actor update cannot fit on this GPU" in str(info.value)
    assert "estimated in the driver for an empty GPU of 16.0 GiB" in str(info.value)
    monkeypatch.setattr(gpu_info, "visible_gpu_total_bytes", lambda: 80 * GIB)
    validate(cfg, check_files=False)
    monkeypatch.setattr(gpu_info, "visible_gpu_total_bytes", lambda: None)  # no NVML: the workers check
    assert auto_settings.memory_problems(cfg, 1) == []


def test_models_the_estimate_does_not_describe_get_the_constants(tmp_path, monkeypatch):
    """A mixture-of-experts config (or one without the dense fields) is not estimated: fixed budgets, checkpointing
    on, and the reason in the log line."""
    from types import SimpleNamespace

    moe = Qwen2Config(**QWEN_05B)
    moe.num_experts = 8
    assert auto_settings.unestimated(moe) == "a mixture-of-experts model"
    assert auto_settings.unestimated(SimpleNamespace(hidden_size=8)) == (
        "its config has no num_hidden_layers, num_attention_heads, intermediate_size, vocab_size")
    assert auto_settings.unestimated(Qwen2Config(**QWEN_05B)) is None
    monkeypatch.setattr(auto_settings, "gpu_memory", lambda device, asleep=0: GPU_32)  # as if on a GPU
    _, notes = auto_settings.resolve_actor_settings(grpo_config(), moe, str(tmp_path), torch.device("cpu"), 1)
    assert "gradient checkpointing auto → on (no memory estimate for a mixture-of-experts model)" in notes


def test_the_actor_leaves_the_critic_budgets_to_the_critic():
    cfg = grpo_config("algorithm.adv_estimator=gae")  # a critic, no reference
    choices = auto_settings.actor_choices(cfg, dp=1)
    assert choices.forward_budget_keys == ["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"]
    critic = auto_settings.critic_choices(cfg, dp=1)
    assert (critic.update_budget_key, critic.forward_budget_keys) == (
        "critic.ppo_max_token_len_per_gpu", ["critic.forward_max_token_len_per_gpu"])
    with_ref = auto_settings.actor_choices(grpo_config("actor_rollout_ref.actor.use_kl_loss=true"), dp=1)
    assert with_ref.forward_budget_keys == ["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
                                            "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"]


# Ulysses: budgets are per GPU (veRL's unit); a micro-batch of an SP=2 group holds twice the budget
SP2 = ("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2", "trainer.n_gpus_per_node=2")
STATIC_05B_2_SHARDS = 16 * 247_016_384  # fp32 weights, gradients and Adam of 494,032,768 parameters over 2 GPUs


def test_under_ulysses_the_derived_budget_counts_the_tokens_one_gpu_holds():
    cfg = grpo_config("actor_rollout_ref.actor.ppo_mini_batch_size=8", *SP2)
    choices = auto_settings.actor_choices(cfg, dp=1)
    # 8 prompts × 4 samples × 320 tokens = 10,240 tokens per mini-batch, 5,120 on each GPU of the SP group
    assert choices.target_tokens == 5_120
    decision = auto_settings.plan_role(cfg, "actor", shape(QWEN_05B), GPU_32, 2, choices)
    # (29,850,022,707 − 3,952,262,144 − 1,238,208,256 − 2,489,319,424) / 1,033,304 B per token on this GPU
    # = 21,455.7 → 21,248 (× 256); the whole-micro-batch reading would have been twice that, capped at 32,768
    assert (29_850_022_707 - STATIC_05B_2_SHARDS - FSDP_05B - LOGITS_05B) // 1_033_304 == 21_455
    assert decision.update_budget == 21_248
    # the same GPU and state without Ulysses (2 data-parallel ranks) gets the same per-GPU budget
    plain = grpo_config("actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.n_gpus_per_node=2")
    assert auto_settings.plan_role(plain, "actor", shape(QWEN_05B), GPU_32, 2,
                                   auto_settings.actor_choices(plain, dp=2)).update_budget == 21_248
    text = "; ".join(decision.notes)
    assert ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu auto → 21248 per GPU (micro-batches of 42496 tokens "
            "over 2 GPUs)") in text
    assert "for micro-batches of 5120 tokens per GPU" in text and "activations 0.99 MiB/token" in text
    # the critic's target follows the critic's own Ulysses size
    gae = grpo_config("actor_rollout_ref.actor.ppo_mini_batch_size=8", "algorithm.adv_estimator=gae",
                      "critic.ppo_mini_batch_size=8", "critic.ulysses_sequence_parallel_size=2", *SP2)
    assert auto_settings.critic_choices(gae, dp=1).target_tokens == 5_120


def test_under_ulysses_a_derived_budget_must_hold_the_longest_sequence_times_the_group():
    # checkpointing off by the user: 21,248 tokens per GPU; 33,280-token sequences fit 2 × 21,248 = 42,496
    long = ("data.max_response_length=33216", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8", "trainer.n_gpus_per_node=2")
    cfg = grpo_config(*long, SP2[0])
    decision = auto_settings.plan_role(cfg, "actor", shape(QWEN_05B), GPU_32, 2, auto_settings.actor_choices(cfg, 1))
    assert decision.update_budget == 21_248
    with pytest.raises(MemoryPlanError, match="ppo_max_token_len_per_gpu auto → 21248 tokens from the GPU's free "):
        plain = grpo_config(*long)
        auto_settings.plan_role(plain, "actor", shape(QWEN_05B), GPU_32, 2, auto_settings.actor_choices(plain, 2))
    # 49,216-token sequences do not fit 42,496
    cfg = grpo_config(*long, SP2[0], "data.max_response_length=49152")
    with pytest.raises(MemoryPlanError) as info:
        auto_settings.plan_role(cfg, "actor", shape(QWEN_05B), GPU_32, 2, auto_settings.actor_choices(cfg, 1))
    assert ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu auto → 21248 tokens per GPU (micro-batches of 42496 "
            "tokens over 2 GPUs) from the GPU's free memory with gradient checkpointing off, smaller than the longest "
            "sequence, data.max_prompt_length + data.max_response_length = 49216 tokens") in str(info.value)


def test_the_cpu_constant_is_per_gpu_under_ulysses(tmp_path):
    resolved, notes = auto_settings.resolve_actor_settings(grpo_config(*SP2), Qwen2Config(**QWEN_05B), str(tmp_path),
                                                           torch.device("cpu"), world_size=2)
    assert resolved.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 16_384
    assert ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu, "
            "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu auto → 16384 per GPU (micro-batches of 32768 "
            "tokens over 2 GPUs) (CPU run: a fixed budget, no memory estimate)") in notes
    # 40,000-token sequences: 20,000 per GPU is enough for the pair (the whole-micro-batch reading needed 40,000)
    resolved, _ = auto_settings.resolve_actor_settings(grpo_config(*SP2, "data.max_response_length=39936"),
                                                       Qwen2Config(**QWEN_05B), str(tmp_path), torch.device("cpu"),
                                                       world_size=2)
    assert resolved.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 20_000
    assert resolved.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 20_000


def test_a_distillation_teacher_is_counted_like_the_reference():
    cfg = grpo_config("distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/teacher")
    counts = {"actor": 1000, "critic": 1000, "teacher": 3000}
    tenants = auto_settings.gpu_tenants(cfg, counts, shards=1)
    # the update holds the actor's 16 B/param and the teacher's fp32 weights, 4 B/param of its 3000 parameters
    assert auto_settings.resident_bytes(tenants, "actor", updating=True) == 16_000 + 12_000
    cfg = grpo_config("distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/teacher",
                      "actor_rollout_ref.ref.fsdp_config.param_offload=true")
    tenants = auto_settings.gpu_tenants(cfg, counts, shards=1)
    assert auto_settings.resident_bytes(tenants, "actor", updating=True) == 16_000  # offloaded with the reference
    # its own forward: the teacher's weights beside the actor's weights and Adam state (12 B/param, no gradients)
    assert auto_settings.resident_bytes(tenants, "teacher", updating=False) == 12_000 + 12_000


def test_a_teacher_without_a_reference_gets_the_reference_batching_decided(tmp_path):
    """The teacher's log-probs are batched with actor_rollout_ref.ref's settings, so they are decided even when no
    reference phase runs (use_kl_loss=false): left unset they failed the first teacher phase on a GPU."""
    distill = ("distillation.enabled=true", "distillation.teacher_models.teacher_model.model_path=/teacher")
    cfg = grpo_config(*distill)
    assert not cfg.use_reference
    assert auto_settings.actor_choices(cfg, dp=1).forward_budget_keys == [
        "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
        "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"]
    resolved, notes = auto_settings.resolve_actor_settings(cfg, Qwen2Config(**QWEN_05B), str(tmp_path),
                                                           torch.device("cpu"), world_size=1)
    ref = resolved.actor_rollout_ref.ref
    assert (ref.log_prob_use_dynamic_bsz, ref.log_prob_max_token_len_per_gpu) == (True, 16_384)
    assert "actor_rollout_ref.ref.log_prob_use_dynamic_bsz auto → true (no micro-batch size set)" in notes
    plain, _ = auto_settings.resolve_actor_settings(grpo_config(), Qwen2Config(**QWEN_05B), str(tmp_path),
                                                    torch.device("cpu"), world_size=1)
    assert plain.actor_rollout_ref.ref.log_prob_use_dynamic_bsz is False  # neither a reference nor a teacher
