"""PPO epochs with shuffle=true visit the batch in one order on every training backend: epoch e is the permutation
of the original batch seeded by data_loader_seed + e (FSDP used to permute its already-permuted batch again, so the
backends agreed only for ppo_epochs=1)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from helpers.megatron_cpu import cuda_as_cpu, require_megatron_core
from helpers.ppo_batches import ragged_ppo_batch

EPOCHS, SEED, ROWS = 3, 7, 8


def _expected_rows() -> list[int]:
    order = []
    for epoch in range(EPOCHS):
        order += torch.randperm(ROWS, generator=torch.Generator().manual_seed(SEED + epoch)).tolist()
    return order


def _batch():
    data = ragged_ppo_batch(3, rows=ROWS, token_range=(1, 61), critic=True, meta_info={"temperature": 1.0})
    assert len({tuple(r) for r in data.batch["input_ids"].tolist()}) == ROWS  # rows are told apart by their ids
    return data


def _row_indices(data, seen: list[torch.Tensor]) -> list[int]:
    rows = [tuple(r) for r in data.batch["input_ids"].tolist()]
    return [rows.index(tuple(r)) for ids in seen for r in ids.tolist()]


def _role_config(cls, **extra):
    cfg = cls(ppo_epochs=EPOCHS, shuffle=True, data_loader_seed=SEED, ppo_mini_batch_size=ROWS, **extra)
    cfg.optim.lr = 1e-3
    return cfg


def _hf_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        tie_word_embeddings=True, architectures=["Qwen2ForCausalLM"]))


def _record_inputs(module, seen: list) -> None:
    module.register_forward_pre_hook(lambda mod, args, kwargs: seen.append(kwargs["input_ids"].clone()),
                                     with_kwargs=True)


def test_fsdp_actor_and_critic_visit_each_epoch_as_a_permutation_of_the_batch():
    from verlx.config.roles import ActorConfig, CriticConfig
    from verlx.models.policy import PolicyModel, ValueModel
    from verlx.workers.actor import PPOActor
    from verlx.workers.critic import PPOCritic
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import build_optimizer

    data = _batch()
    actor_cfg = _role_config(ActorConfig)
    policy = PolicyModel(_hf_model())
    actor_seen: list = []
    _record_inputs(policy, actor_seen)
    engine = FSDPEngine("actor", policy, build_optimizer(policy.parameters(), actor_cfg.optim))
    PPOActor(actor_cfg, engine).update_policy(data, ROWS, 2)

    critic_cfg = _role_config(CriticConfig)
    hf = _hf_model()
    value = ValueModel(hf.model, hf.config.hidden_size)
    critic_seen: list = []
    _record_inputs(value, critic_seen)
    engine = FSDPEngine("critic", value, build_optimizer(value.parameters(), critic_cfg.optim))
    PPOCritic(critic_cfg, engine).update_critic(data, ROWS, 2)

    assert _row_indices(data, actor_seen) == _expected_rows()
    assert _row_indices(data, critic_seen) == _expected_rows()


def test_megatron_critic_visits_the_batch_in_the_same_order(tmp_path, monkeypatch):
    require_megatron_core()
    from verlx.config.engine import CriticModelConfig, MegatronConfig
    from verlx.config.roles import CriticConfig
    from verlx.workers.critic import PPOCritic
    from verlx.workers.engine import ModelSpec
    from verlx.workers.megatron.engine import MegatronEngine

    hf = _hf_model()
    hf.save_pretrained(tmp_path / "hf")
    cfg = _role_config(CriticConfig, grad_clip=0.0, megatron=MegatronConfig(
        dtype="float32", use_transformer_engine="false", use_distributed_optimizer=False))
    spec = ModelSpec("critic", str(tmp_path / "hf"), CriticModelConfig(enable_gradient_checkpointing=False), cfg,
                     hf.config, torch.device("cpu"), value_head=True)
    dist.init_process_group("gloo", init_method=f"file://{os.path.join(tmp_path, 'init')}", rank=0, world_size=1)
    try:
        with cuda_as_cpu(monkeypatch):
            engine = MegatronEngine.build(spec, MegatronEngine.place({"critic": cfg}, hf.config, 1))
            seen: list = []
            prepare = engine.runner.prepare
            monkeypatch.setattr(engine.runner, "prepare",
                                lambda parts: seen.extend(p.batch["input_ids"] for p in parts) or prepare(parts))
            data = _batch()
            PPOCritic(cfg, engine).update_critic(data, ROWS, 2)
    finally:
        from megatron.core import parallel_state as mpu

        mpu.destroy_model_parallel()
        dist.destroy_process_group()
    assert _row_indices(data, seen) == _expected_rows()
