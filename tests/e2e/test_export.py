"""A trained checkpoint exported with model_merger loads with from_pretrained and gives the actor's log-probs."""

from __future__ import annotations

import torch

from helpers.e2e import make_config
from verlx.batch_columns import LOG_PROB_INPUTS, MODEL_INPUTS
from verlx.model_merger import main as merger_main
from verlx.trainer.main_ppo import prepare, run_ppo
from verlx.trainer.ppo_trainer import RayPPOTrainer


def test_exported_model_matches_the_actor(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    overrides = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "trainer.save_freq=1",
                 "actor_rollout_ref.actor.entropy_coeff=0.05"]
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *overrides))
    target = tmp_path / "hf"
    assert merger_main(["merge", "--local_dir", f"{tmp_path}/ckpt/global_step_1/actor",
                        "--target_dir", str(target)]) == 0

    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *overrides)
    use_gpu, tokenizer, train_loader, val_loader, reward = prepare(cfg)
    trainer = RayPPOTrainer(cfg, tokenizer, train_loader, val_loader, reward, reward, use_gpu)
    try:
        trainer.init_workers()
        trainer.load_checkpoint()
        prompts = next(iter(val_loader))
        rollout = trainer.actor_rollout_wg.generate_sequences(prompts.select(list(MODEL_INPUTS), [], []))
        actor = trainer.actor_rollout_wg.compute_log_prob(rollout.select(list(LOG_PROB_INPUTS), [], []))
    finally:
        trainer.shutdown()
        reward.close()

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
    batch = rollout.batch
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       position_ids=batch["position_ids"]).logits
    r = batch["responses"].shape[1]
    exported = torch.log_softmax(logits[:, -r - 1:-1], -1).gather(-1, batch["responses"].unsqueeze(-1)).squeeze(-1)
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(exported[mask], actor.batch["old_log_probs"][mask], rtol=0, atol=1e-5)
    # and the base model it started from is different (training moved the weights)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        base_logits = base(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                           position_ids=batch["position_ids"]).logits
    assert not torch.allclose(base_logits, logits, atol=1e-4)


def test_merger_errors_name_the_problem(tmp_path, capsys):
    assert merger_main(["merge", "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "out")]) == 2
    assert "holds no checkpoint shards" in capsys.readouterr().err
