"""The reward model on real Ray actors (2 CPU processes, FSDP2 over gloo, colocated with the actor as in training):
its scores equal a direct forward of the checkpoint (AutoModelForSequenceClassification, one sequence at a time) on
the same sequences, with the chat re-rendered in the reward model's template (veRL's input_tokenizer) and without."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from helpers.e2e import make_config
from helpers.tiny_tokenizer import build_tiny_tokenizer
from verlx.protocol import DataProto
from verlx.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_cls,
)
from verlx.workers.groups import ROLE_GROUPS
from verlx.workers.reward_model_worker import RewardModelWorker

PROMPTS = [[{"role": "user", "content": f"{a}+{b}?"}] for a, b in ((1, 2), (30, 4), (5, 66), (7, 8))]
RESPONSES = ["3", "34 it is", "71", ""]  # the last is empty: its score goes to column 0


def _batch(tokenizer, width: int = 10) -> DataProto:
    """A rollout batch in the trainer's layout: left-padded prompts, responses (+ eos) right-padded to `width`."""
    pad = tokenizer.pad_token_id
    prompts = [tokenizer(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"] for p in PROMPTS]
    responses = [(tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]) if r else []
                 for r in RESPONSES]
    p_width = max(map(len, prompts))
    ids = [[pad] * (p_width - len(p)) + p + r + [pad] * (width - len(r)) for p, r in zip(prompts, responses)]
    mask = [[0] * (p_width - len(p)) + [1] * (len(p) + len(r)) + [0] * (width - len(r))
            for p, r in zip(prompts, responses)]
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    raw = np.empty(len(PROMPTS), dtype=object)
    raw[:] = [list(p) for p in PROMPTS]
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                      "responses": ids[:, -width:]}, {"raw_prompt": raw})


def _direct(path, texts_or_ids) -> list[float]:
    """The checkpoint's score at the last token of each sequence, run alone. veRL's reward-model worker loads it as
    AutoModelForTokenClassification and reads the last real token's logit; so does this reference (the sequence-
    classification head would skip a final eos that doubles as the pad token)."""
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    model = AutoModelForTokenClassification.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    out = []
    with torch.no_grad():
        for item in texts_or_ids:
            ids = tokenizer(item, add_special_tokens=False)["input_ids"] if isinstance(item, str) else item
            out.append(model(input_ids=torch.tensor([ids])).logits[0, -1, 0].item())
    return out


def _rm_scores(config, batch: DataProto) -> torch.Tensor:
    roles = {"reward_model": RayClassWithInitArgs(RewardModelWorker, config=config)}
    pool = RayResourcePool([2], use_gpu=False, name_prefix="rm")
    group = RayWorkerGroup(pool, create_colocated_worker_cls(roles), name="rm")
    try:
        view = group.spawn({"reward_model": ROLE_GROUPS["reward_model"]})["reward_model"]
        view.init_model()
        return view.compute_rm_score(batch).batch["rm_scores"]
    finally:
        group.shutdown()
        pool.release()


def _last_response_token(batch: DataProto) -> list[int]:
    mask = batch.batch["attention_mask"][:, -batch.batch["responses"].shape[1]:]
    return [int(m.nonzero().max()) if m.any() else 0 for m in mask]


@pytest.mark.parametrize("retemplate", [True, False], ids=["reward-model-template", "policy-tokens"])
def test_reward_model_scores_equal_a_direct_forward(ray_cpu, tiny_model_dir, tiny_reward_model_dir,
                                                    arithmetic_data_dir, tmp_path, retemplate):
    overrides = ["reward_model.enable=true", f"reward_model.model.path={tiny_reward_model_dir}"]
    if retemplate:  # token budgets, padded forward
        overrides += ["reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=40"]
    else:  # the policy's own tokens, fixed micro-batches of one, packed forward
        overrides += ["reward_model.model.input_tokenizer=null", "reward_model.micro_batch_size_per_gpu=1",
                      "reward_model.model.use_remove_padding=true"]
    config = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *overrides)
    tokenizer = build_tiny_tokenizer()
    batch = _batch(tokenizer)
    scores = _rm_scores(config, batch)
    if retemplate:  # veRL: the response decoded, its eos text dropped, the chat rendered in the RM's template
        expected = _direct(tiny_reward_model_dir, [
            "".join(f"{m['role']}: {m['content']}\n" for m in [*p, {"role": "assistant", "content": r}])
            for p, r in zip(PROMPTS, RESPONSES)])
    else:
        mask = batch.batch["attention_mask"].bool()
        expected = _direct(tiny_reward_model_dir, [row[m].tolist() for row, m in zip(batch.batch["input_ids"], mask)])
    assert scores.shape == batch.batch["responses"].shape
    last = _last_response_token(batch)
    assert last == [1, 8, 2, 0]
    placed = torch.tensor([scores[i, j].item() for i, j in enumerate(last)])
    torch.testing.assert_close(placed, torch.tensor(expected), rtol=0, atol=1e-5)
    assert torch.count_nonzero(scores).item() == 4 and len(set(expected)) == 4
    assert dataclasses.asdict(config.reward_model)["enable"]
