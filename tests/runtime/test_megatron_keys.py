"""The megatron keys veRL users set, on the megatron engine as the workers build it (CPU, one gloo rank, fp32):
optim.lr_decay_style & co. (megatron-core's parameter scheduler, across a checkpoint), the override sections
(transformer, DDP, optimizer) reaching megatron-core, and use_dist_checkpointing (initial weights from a
dist-checkpoint: verlx's own, or a bare GPTModel's with transformer-engine names as megatron's converters write)."""

from __future__ import annotations

import math

import pytest
import torch

from helpers.ppo_batches import ragged_ppo_batch


def _engine(path, megatron=None, optim=None, total_steps=6):
    from verlx.config.engine import MegatronConfig, ModelConfig
    from verlx.config.roles import ActorConfig
    from verlx.models.hf_config import load_hf_config
    from verlx.utils.distributed import init_distributed
    from verlx.workers.engine import ModelSpec
    from verlx.workers.megatron.engine import MegatronEngine

    init_distributed()
    cfg = ActorConfig(strategy="megatron", grad_clip=0.0, ppo_micro_batch_size_per_gpu=2)
    cfg.megatron = MegatronConfig(dtype="float32", use_transformer_engine="false", use_distributed_optimizer=False,
                                  **(megatron or {}))
    cfg.optim.weight_decay = 0.0
    for key, value in (optim or {}).items():
        setattr(cfg.optim, key, value)
    hf_config = load_hf_config(path, False, {})
    placement = MegatronEngine.place({"actor_rollout_ref.actor": cfg}, hf_config, 1)
    spec = ModelSpec("actor", path, ModelConfig(path=path, enable_gradient_checkpointing=False), cfg, hf_config,
                     torch.device("cpu"), total_steps=total_steps)
    return MegatronEngine.build(spec, placement), cfg


def _update(engine, cfg) -> dict:
    from verlx.workers.actor import PPOActor

    return PPOActor(cfg, engine).update_policy(ragged_ppo_batch(0, rows=4, meta_info={"temperature": 1.0}), 4, 2)


def _weights(engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for c in engine.chunks for n, p in c.named_parameters()}


def test_lr_decay_style_is_megatrons_schedule_and_survives_a_checkpoint(megatron_on_cpu, tiny_model_dir, tmp_path):
    optim = dict(lr=1e-3, lr_decay_style="cosine", lr_warmup_steps=2, lr_warmup_init=1e-4, min_lr=1e-4)
    engine, _ = _engine(tiny_model_dir, optim=optim, total_steps=6)

    def cosine(step):  # warm-up 1e-4 → 1e-3 over 2 steps, then half a cosine down to 1e-4 at step 6
        if step <= 2:
            return 1e-4 + 9e-4 * step / 2
        return 1e-4 + 9e-4 * 0.5 * (1 + math.cos(math.pi * min(step - 2, 4) / 4))

    seen = []
    for _ in range(7):
        seen.append(engine.lr())
        assert engine.runner.optimizer.param_groups[0]["lr"] == pytest.approx(seen[-1])  # what the step uses
        engine.step_lr()
    assert seen == pytest.approx([cosine(s) for s in range(7)])
    assert seen[3] == pytest.approx(1e-4 + 9e-4 * 0.5 * (1 + math.sqrt(0.5)))

    engine, cfg = _engine(tiny_model_dir, optim=optim, total_steps=6)
    _update(engine, cfg)  # a checkpoint is written after optimizer steps: the Adam state exists
    for _ in range(3):
        engine.step_lr()
    engine.save_checkpoint(str(tmp_path / "actor"))
    resumed, _ = _engine(tiny_model_dir, optim=optim, total_steps=6)
    resumed.load_checkpoint(str(tmp_path / "actor"))
    assert resumed.lr() == pytest.approx(cosine(3))
    resumed.step_lr()
    assert resumed.lr() == pytest.approx(cosine(4))


def test_inverse_square_root_in_veRLs_spelling(megatron_on_cpu, tiny_model_dir):
    engine, _ = _engine(tiny_model_dir, optim=dict(lr=1e-3, lr_decay_style="inverse_square_root",
                                                   lr_warmup_steps=4), total_steps=100)
    for _ in range(16):
        engine.step_lr()
    assert engine.lr() == pytest.approx(1e-3 * math.sqrt(4) / math.sqrt(16))


def test_override_sections_reach_megatron(megatron_on_cpu, tiny_model_dir):
    megatron = {"override_transformer_config": {"recompute_granularity": None, "attention_backend": "flash",
                                                "deallocate_pipeline_outputs": True},
                "override_ddp_config": {"grad_reduce_in_fp32": False}}
    engine, cfg = _engine(tiny_model_dir, megatron=megatron, optim={"override_optimizer_config": {"adam_eps": 10.0},
                                                                   "lr": 1e-3})
    config = engine.runner.config
    assert config.deallocate_pipeline_outputs is True and config.recompute_granularity is None
    assert engine.runner.chunks[0].ddp_config.grad_reduce_in_fp32 is False
    assert {o.config.adam_eps for o in engine.runner.optimizer.chained_optimizers} == {10.0}
    before = _weights(engine)
    _update(engine, cfg)
    big_eps = max((p - before[n]).abs().max().item() for n, p in _weights(engine).items())

    default, cfg = _engine(tiny_model_dir, optim={"lr": 1e-3})
    before = _weights(default)
    _update(default, cfg)
    moved = max((p - before[n]).abs().max().item() for n, p in _weights(default).items())
    # Adam's first step moves a weight by lr·g/(|g| + eps): about lr with eps=1e-8, far less with eps=10
    assert moved == pytest.approx(1e-3, rel=1e-3) and big_eps < 1e-5


def test_use_dist_checkpointing_loads_the_initial_weights(megatron_on_cpu, tiny_model_dir, tmp_path):
    from megatron.core import dist_checkpointing

    from verlx.workers.megatron.weight_layout import te_name

    trained, cfg = _engine(tiny_model_dir, optim={"lr": 1e-3})
    hf_weights = _weights(trained)
    _update(trained, cfg)
    expected = _weights(trained)
    trained.save_checkpoint(str(tmp_path / "global_step_1" / "actor"))

    loaded, _ = _engine(tiny_model_dir, megatron={"use_dist_checkpointing": True,
                                                  "dist_checkpointing_path": str(tmp_path / "global_step_1/actor")})
    got = _weights(loaded)
    assert all(torch.equal(got[n], expected[n]) for n in expected)
    assert not all(torch.equal(got[n], hf_weights[n]) for n in expected)

    # a bare GPTModel's checkpoint with transformer-engine names (what megatron's and veRL's converters write)
    bare = {}
    for name, value in trained.chunks[0].gpt.sharded_state_dict(prefix="").items():
        if not name.endswith("_extra_state"):
            value.key = te_name(value.key)
            bare[name] = value
    (tmp_path / "converted").mkdir()
    dist_checkpointing.save(bare, str(tmp_path / "converted"))
    loaded, _ = _engine(tiny_model_dir, megatron={"use_dist_checkpointing": True,
                                                  "dist_checkpointing_path": str(tmp_path / "converted")})
    got = _weights(loaded)
    assert all(torch.equal(got[n], expected[n]) for n in expected)

    with pytest.raises(FileNotFoundError, match="is not a megatron dist-checkpoint"):
        _engine(tiny_model_dir, megatron={"use_dist_checkpointing": True, "dist_checkpointing_path": str(tmp_path)})
