"""The model-based reward model's pieces on CPU, against hand-built references: the score module equals the
checkpoint's own sequence-classification forward, veRL's re-templating of the chat, the score's place, and how the
reward managers take rm_scores (veRL: as the reward; with a custom function: as extra_info["rm_score"])."""

from __future__ import annotations

import pytest
import torch

from helpers.tiny_tokenizer import PLAIN_TEMPLATE, build_tiny_tokenizer
from verlx.config.engine import RefFSDPConfig
from verlx.config.reward_model import RewardModelModelConfig
from verlx.config.run import RewardConfig
from verlx.protocol import DataProto
from verlx.reward.managers import NaiveRewardManager
from verlx.reward.scores import default_compute_score
from verlx.workers.fsdp.model_builder import load_score_model
from verlx.workers.reward_model_inputs import retemplated_inputs, scores_at_last_response_token


def _direct_scores(path, sequences: list[list[int]]) -> list[float]:
    """The checkpoint's own forward (AutoModelForSequenceClassification), one unpadded sequence at a time."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return [model(input_ids=torch.tensor([ids])).logits[0, 0].item() for ids in sequences]


def _padded(sequences: list[list[int]], pad: int, left: bool) -> dict[str, torch.Tensor]:
    width = max(map(len, sequences))
    ids = torch.full((len(sequences), width), pad)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for i, seq in enumerate(sequences):
        span = slice(width - len(seq), width) if left else slice(0, len(seq))
        ids[i, span], mask[i, span] = torch.tensor(seq), 1
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}


@pytest.mark.parametrize("packed,left", [(False, False), (False, True), (True, False)],
                         ids=["padded-right", "padded-left", "packed"])
def test_score_model_equals_the_checkpoints_forward(tiny_reward_model_dir, packed, left):
    sequences = [[5, 9, 14, 20, 31], [7, 7, 40], [12, 13, 14, 15, 16, 17, 18, 19], [3]]
    model_cfg = RewardModelModelConfig(path=tiny_reward_model_dir, use_remove_padding=packed,
                                       fsdp_config=RefFSDPConfig())
    module = load_score_model(tiny_reward_model_dir, model_cfg, torch.float32).eval()
    with torch.no_grad():
        scores = module(**_padded(sequences, pad=0, left=left))
    expected = torch.tensor(_direct_scores(tiny_reward_model_dir, sequences))
    assert scores.shape == (4,) and scores.dtype == torch.float32
    assert expected.std() > 0.1  # the scores tell the sequences apart
    # padding masks (and packing's per-sequence attention) change float rounding only
    torch.testing.assert_close(scores, expected, rtol=0, atol=1e-5)


def _rollout_batch(tokenizer, prompts: list[list[dict]], responses: list[str], width: int = 12) -> DataProto:
    """Prompt tokens left-padded to 16, responses (+ eos) right-padded to `width`, raw chats alongside."""
    import numpy as np

    pad = tokenizer.pad_token_id
    prompt_ids = [tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=True) for p in prompts]
    prompt_ids = [list(ids["input_ids"]) if isinstance(ids, dict) or hasattr(ids, "keys") else list(ids)
                  for ids in prompt_ids]
    response_ids = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in responses]
    p_width = max(map(len, prompt_ids))
    rows, masks = [], []
    for p, r in zip(prompt_ids, response_ids):
        r = r[:width]
        rows.append([pad] * (p_width - len(p)) + p + r + [pad] * (width - len(r)))
        masks.append([0] * (p_width - len(p)) + [1] * (len(p) + len(r)) + [0] * (width - len(r)))
    ids, mask = torch.tensor(rows), torch.tensor(masks)
    raw = np.empty(len(prompts), dtype=object)
    for i, p in enumerate(prompts):
        raw[i] = p
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
                      "responses": ids[:, -width:]}, {"raw_prompt": raw})


PROMPTS = [[{"role": "user", "content": "1+1?"}], [{"role": "system", "content": "be brief"},
                                                    {"role": "user", "content": "2*3?"}]]


def test_retemplating_renders_the_chat_with_the_reward_models_template():
    policy = build_tiny_tokenizer()
    rm = build_tiny_tokenizer()
    rm.chat_template = PLAIN_TEMPLATE
    batch = _rollout_batch(policy, PROMPTS, ["2", "six!"])
    inputs = retemplated_inputs(batch, policy, rm, max_length=None)
    # veRL: decode the response with the policy's tokenizer, drop its eos text, append it as the assistant turn
    texts = ["user: 1+1?\nassistant: 2\n", "system: be brief\nuser: 2*3?\nassistant: six!\n"]
    expected = [rm(t, add_special_tokens=False)["input_ids"] for t in texts]
    width = max(map(len, expected))
    assert inputs.batch["input_ids"].shape == (2, width)
    for row, ids in enumerate(expected):
        assert inputs.batch["input_ids"][row, : len(ids)].tolist() == ids
        assert inputs.batch["attention_mask"][row].tolist() == [1] * len(ids) + [0] * (width - len(ids))
        assert inputs.batch["position_ids"][row, : len(ids)].tolist() == list(range(len(ids)))
    cut = retemplated_inputs(batch, policy, rm, max_length=10)  # cut on the right, as veRL does
    assert cut.batch["input_ids"].tolist() == [ids[:10] for ids in expected]
    del batch.non_tensor_batch["raw_prompt"]
    with pytest.raises(KeyError, match="data.return_raw_chat=true"):
        retemplated_inputs(batch, policy, rm, max_length=None)


def test_the_score_goes_to_the_last_response_token():
    mask = torch.tensor([[1, 1, 1, 1, 1, 0], [1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])  # prompts of 2, responses 3, 1, 0
    batch = DataProto({"attention_mask": mask, "responses": torch.zeros(3, 4, dtype=torch.long)})
    out = scores_at_last_response_token(batch, torch.tensor([0.5, -2.0, 3.0]))
    assert out.tolist() == [[0, 0, 0.5, 0], [-2.0, 0, 0, 0], [3.0, 0, 0, 0]]


def test_managers_take_rm_scores_as_veRL_does(tmp_path):
    tokenizer = build_tiny_tokenizer()
    batch = _rollout_batch(tokenizer, PROMPTS, ["2", "six!"])
    batch.non_tensor_batch["data_source"] = __import__("numpy").array(["openai/gsm8k"] * 2, dtype=object)
    batch.non_tensor_batch["reward_model"] = __import__("numpy").array([{"ground_truth": "2"}] * 2, dtype=object)
    rm_scores = torch.zeros(2, 12)
    rm_scores[0, 1], rm_scores[1, 4] = 0.75, -1.5
    batch.batch["rm_scores"] = rm_scores

    def never(**kwargs):
        raise AssertionError("the reward function must not run when rm_scores are the reward")

    # without a custom function the reward model's score is the reward: no function runs, nothing is shaped
    with NaiveRewardManager(tokenizer, never, config=RewardConfig(num_workers=0)) as manager:
        result = manager(batch)
    assert torch.equal(result.token_level_scores, rm_scores)
    assert result.extra["score"].tolist() == [0.75, -1.5] and list(result.extra["reward_status"]) == ["ok", "ok"]

    # with one, the function combines: it gets the score as extra_info["rm_score"]
    def combined(data_source, solution_str, ground_truth, extra_info):
        return default_compute_score(data_source, solution_str, ground_truth) + 10 * extra_info["rm_score"]

    with NaiveRewardManager(tokenizer, combined, config=RewardConfig(num_workers=0),
                            rm_score_use="extra_info") as manager:
        result = manager(batch)
    # gsm8k's strict format needs "#### 2": both responses score 0 by rule
    assert result.token_level_scores.sum(-1).tolist() == [7.5, -15.0]
