"""The actor's update with on-policy distillation, on the FSDP engine (CPU): minimising k3 alone
(use_task_rewards=false, use_policy_gradient=false) moves the student's log-probs of a fixed batch towards a
teacher's, and the task's advantages then play no part in the update."""

from __future__ import annotations

import torch

from helpers.ppo_batches import ragged_ppo_batch
from verlx.algorithms.core import masked_mean
from verlx.config.distillation import DistillationLossConfig

ROWS = 8


def _policy(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verlx.models.policy import PolicyModel

    torch.manual_seed(seed)
    return PolicyModel(Qwen2ForCausalLM(Qwen2Config(
        vocab_size=61, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True,
        architectures=["Qwen2ForCausalLM"])))


def _actor(seed: int, distillation=None):
    from verlx.config.roles import ActorConfig
    from verlx.workers.actor import PPOActor
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import build_optimizer

    cfg = ActorConfig(ppo_mini_batch_size=ROWS, ppo_epochs=4)
    cfg.optim.lr = 1e-2
    policy = _policy(seed)
    return PPOActor(cfg, FSDPEngine("actor", policy, build_optimizer(policy.parameters(), cfg.optim)),
                    distillation=distillation)


def _log_probs(actor, data) -> torch.Tensor:
    return actor.compute_log_prob(data, ROWS, False, 1 << 20)[0]


def _distilled(data, advantages_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The student's log-probs before and after one update (4 PPO epochs) towards the teacher."""
    student = _actor(0, DistillationLossConfig(loss_mode="k3", use_task_rewards=False))
    batch = data.select(deepcopy=True)
    batch.batch["advantages"] = batch.batch["advantages"] * advantages_scale
    before = _log_probs(student, batch)
    batch.batch["old_log_probs"] = before
    student.update_policy(batch, ROWS, 4)
    return before, _log_probs(student, batch)


def test_distilling_with_k3_alone_moves_the_student_towards_the_teacher_whatever_the_advantages():
    data = ragged_ppo_batch(5, rows=ROWS, token_range=(1, 61), meta_info={"temperature": 1.0})
    teacher = _log_probs(_actor(1), data)
    data.batch["teacher_log_prob"] = teacher
    mask = data.batch["response_mask"]
    before, after = _distilled(data, advantages_scale=1.0)

    def gap(log_prob):
        return masked_mean((log_prob - teacher).abs(), mask).item()

    # two random models of 61 tokens are both near uniform: they differ by 0.11 nat per token here, and the update
    # closes about a third of that (0.075)
    assert gap(before) > 0.1
    assert gap(after) < 0.8 * gap(before), (gap(before), gap(after))
    # neither the task's policy loss nor its advantages take part: zero advantages give the same update
    _, after_without_advantages = _distilled(data, advantages_scale=0.0)
    torch.testing.assert_close(after, after_without_advantages, atol=1e-6, rtol=0)


def _topk_kl(actor, data, ids, log_probs) -> torch.Tensor:
    """The student's forward KL over the teacher's top-k at each response position, [B, R]."""
    from verlx.batch_columns import MODEL_INPUTS

    with torch.no_grad():
        out = actor.engine.module(**{k: data.batch[k] for k in MODEL_INPUTS},
                                  response_length=data.batch["responses"].shape[-1],
                                  teacher_topk=(ids, log_probs, None))
    return out[2]


def test_forward_kl_topk_teacher_gives_its_top_k_and_the_update_closes_the_kl():
    """loss_mode=forward_kl_topk minimised directly: the teacher's top-k agree with its log-probs of the sampled
    tokens wherever those are among them, and one update lowers the student's KL over the teacher's top-k."""
    data = ragged_ppo_batch(5, rows=ROWS, token_range=(1, 61), meta_info={"temperature": 1.0})
    teacher = _actor(1)
    top = teacher.topk_log_probs(data, ROWS, False, 1 << 20, k=20)
    ids, log_probs = top["topk_ids"], top["topk_log_probs"]
    assert ids.shape == log_probs.shape == (*data.batch["responses"].shape, 20)
    sampled = _log_probs(teacher, data)
    mask = data.batch["response_mask"].bool()
    hit = (ids == data.batch["responses"].unsqueeze(-1)) & mask.unsqueeze(-1)
    assert hit.any()
    torch.testing.assert_close(log_probs[hit], sampled.unsqueeze(-1).expand_as(log_probs)[hit])
    assert (log_probs[..., :-1] >= log_probs[..., 1:]).all()  # largest first
    data.batch["teacher_topk_ids"], data.batch["teacher_topk_log_probs"] = ids, log_probs

    student = _actor(0, DistillationLossConfig(loss_mode="forward_kl_topk", topk=20, use_task_rewards=False))
    batch = data.select(deepcopy=True)
    batch.batch["old_log_probs"] = _log_probs(student, batch)
    before = masked_mean(_topk_kl(student, batch, ids, log_probs), mask).item()
    metrics = student.update_policy(batch, ROWS, 4)
    after = masked_mean(_topk_kl(student, batch, ids, log_probs), mask).item()
    assert before > 0.01 and after < 0.8 * before, (before, after)
    assert 0 < metrics["distillation/student_mass"] < 1 and 0 < metrics["distillation/teacher_mass"] < 1
    # the top-k KL is not a divergence of normalised distributions: it goes below zero where the student puts more
    # mass on the teacher's tokens than the teacher does, as veRL's does; the epochs' mean lies below the start
    assert metrics["distillation/loss"] < before
