"""Prompt unpadding and the packing of engine token lists into the shared rollout layout."""

from __future__ import annotations

import pytest
import torch

from verlx.protocol import DataProto
from verlx.rollout.token_io import (
    EngineGenerationError,
    GenerationResult,
    pack_responses,
    prompt_token_lists,
    require_finished,
    require_full_length,
    rollout_batch_from_result,
)


def prompts(ids, mask):
    mask = torch.tensor(mask)
    pos = torch.clamp(torch.cumsum(mask, -1) - 1, min=0)
    return DataProto({"input_ids": torch.tensor(ids), "attention_mask": mask, "position_ids": pos}, {"uid": ["x", "y"]})


def test_prompt_token_lists_strip_left_padding():
    batch = prompts([[0, 0, 4, 5], [7, 8, 9, 3]], [[0, 0, 1, 1], [1, 1, 1, 1]])
    assert prompt_token_lists(batch) == [[4, 5], [7, 8, 9, 3]]


@pytest.mark.parametrize(
    "mask", [[[1, 1, 0, 0], [1, 1, 1, 1]], [[0, 1, 1, 1], [0, 0, 0, 0]], [[0, 1, 1, 1], [1, 0, 1, 1]]]
)
def test_prompts_that_are_not_left_padded(mask):
    with pytest.raises(ValueError, match=r"prompt row [01]: attention_mask is not left-padded or has no token"):
        prompt_token_lists(prompts([[1, 2, 3, 4], [5, 6, 7, 8]], mask))


def test_pack_responses_pads_right_and_masks():
    result = GenerationResult([[5, 6, 2], [7], []], [[-0.5, -0.25, -1.0], [-2.0], []], ["stop", "length", "stop"])
    responses, mask, log_probs = pack_responses(result, response_length=4, pad_token_id=0)
    assert responses.tolist() == [[5, 6, 2, 0], [7, 0, 0, 0], [0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert log_probs.tolist() == [[-0.5, -0.25, -1.0, 0.0], [-2.0, 0.0, 0.0, 0.0], [0.0] * 4]


def test_pack_without_log_probs_and_too_long():
    responses, _, log_probs = pack_responses(GenerationResult([[3, 4]], None, ["stop"]), 2, 9)
    assert responses.tolist() == [[3, 4]] and log_probs is None
    with pytest.raises(EngineGenerationError, match="sample 0 has 3 tokens, more than .*response_length=2"):
        pack_responses(GenerationResult([[3, 4, 5]], None, ["length"]), 2, 9)


def test_result_consistency_checks():
    with pytest.raises(EngineGenerationError, match="sample 0: 2 tokens but 1 log-probs"):
        GenerationResult([[1, 2]], [[-1.0]], ["stop"])
    with pytest.raises(ValueError, match="2 samples but 1 finish reasons"):
        GenerationResult([[1], [2]], None, ["stop"])
    with pytest.raises(EngineGenerationError, match="vllm did not finish sample 3 \\(finish reason 'abort'\\): oom"):
        require_finished("vllm", 3, "abort", "oom")


def test_a_length_stop_before_max_new_tokens_is_an_engine_clip():
    require_full_length("sglang", GenerationResult([[1, 2, 3], [4]], None, ["length", "stop"]), 3)
    with pytest.raises(EngineGenerationError, match="sglang stopped sample 1 for length after 2 of max_new_tokens=3"):
        require_full_length("sglang", GenerationResult([[1, 2, 3], [4, 5]], None, ["length", "length"]), 3)


def test_rollout_batch_with_n_2():
    batch = prompts([[0, 4, 5], [6, 7, 8]], [[0, 1, 1], [1, 1, 1]])
    result = GenerationResult([[1, 2], [3], [4, 5, 6], [2]], None, ["stop", "length", "length", "stop"])
    out = rollout_batch_from_result(batch, result, n=2, response_length=3, pad_token_id=0)
    assert out.batch["prompts"].tolist() == [[0, 4, 5], [0, 4, 5], [6, 7, 8], [6, 7, 8]]
    assert out.batch["responses"].tolist() == [[1, 2, 0], [3, 0, 0], [4, 5, 6], [2, 0, 0]]
    assert out.batch["attention_mask"].tolist() == [
        [0, 1, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]
    ]
    # positions continue after the last prompt position (1 for row 0, 2 for row 1)
    assert out.batch["position_ids"].tolist() == [
        [0, 0, 1, 2, 3, 4], [0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5]
    ]
    assert list(out.non_tensor_batch["uid"]) == ["x", "x", "y", "y"]
    assert "rollout_log_probs" not in out.batch
    with pytest.raises(EngineGenerationError, match="4 samples for 2 prompts × n=3 = 6"):
        rollout_batch_from_result(batch, result, n=3, response_length=3, pad_token_id=0)
