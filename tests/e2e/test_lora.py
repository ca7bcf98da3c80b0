"""LoRA GRPO: the reference is the actor with adapters off, engines get merged weights, optimizer state is small,
and the exported checkpoint is a plain HF model with the adapters merged."""

from __future__ import annotations

import torch

from helpers.e2e import make_config, read_metrics
from verlx.model_merger import merge
from verlx.trainer.main_ppo import run_ppo

COMMON = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true",
          "actor_rollout_ref.actor.entropy_coeff=0.05", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
          "trainer.total_training_steps=2", "trainer.n_gpus_per_node=1"]


def test_lora_grpo(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    full_dir, lora_dir = tmp_path / "full", tmp_path / "lora"
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, full_dir, *COMMON))
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, lora_dir, *COMMON, "trainer.save_freq=2",
                        "actor_rollout_ref.model.lora_rank=2", "actor_rollout_ref.model.lora_alpha=4",
                        "actor_rollout_ref.actor.optim.lr=1e-2"))
    full, lora = read_metrics(full_dir), read_metrics(lora_dir)
    # LoRA B starts at zero: before the first update the adapted actor equals the reference exactly
    assert lora[0]["actor/kl_loss"] == 0.0
    # after an update the adapters moved the policy away from the reference (adapters-off) model ...
    assert lora[1]["actor/kl_loss"] > 0
    # ... and the engine, given merged weights, still matches the actor
    assert lora[1]["rollout/logprob_diff"] < 1e-4
    # Adam keeps 2 fp32 moments per trainable parameter. Full: 80,640 parameters (embedding 6,400 + 2 layers of
    # 37,088 + final norm 64). LoRA r=2 on the 7 linears of a layer: 2·(in+out) each = 2,048 per layer, 4,096 in all:
    # 5.1% of the full state
    assert lora[1]["actor/optimizer_state_gb"] < 0.1 * full[1]["actor/optimizer_state_gb"]

    merge(f"{lora_dir}/ckpt/global_step_2/actor", str(tmp_path / "hf"))
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    names = {n for n, _ in exported.named_parameters()}
    assert names == {n for n, _ in base.named_parameters()}  # plain HF names, no lora_A/lora_B left
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(exported.state_dict()[q], base.state_dict()[q])  # the merged delta is there
