"""rollout.mode=async with sglang and vllm, against the recording stand-ins of their APIs: a single-turn agent
loop returns the batch a synchronous generate returns, and over_sample_rate cancels exactly the slowest samples
and aborts their requests in the engine (SGLang: TokenizerManager.abort_request(abort_all=True), as veRL did;
vLLM: LLMEngine.abort_request with the request ids)."""

from __future__ import annotations

import pytest
import torch

from engine_fakes.contexts import EOS, PAD, make_ctx
from engine_fakes.fake_sglang import install_fake_sglang
from engine_fakes.fake_vllm import install_fake_vllm
from verlx.models.tiny import build_tokenizer
from verlx.protocol import DataProto
from verlx.rollout.agent.runner import AgentLoopRunner

TOKENIZER = build_tokenizer()
PROMPT_LENGTH = 8


def prompts(rows: list[list[int]], **meta) -> DataProto:
    """Left-padded to rollout.prompt_length, as the training data are."""
    ids = torch.full((len(rows), PROMPT_LENGTH), PAD)
    mask = torch.zeros(len(rows), PROMPT_LENGTH, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, PROMPT_LENGTH - len(row):] = torch.tensor(row)
        mask[i, PROMPT_LENGTH - len(row):] = 1
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                     meta_info={"do_sample": True, "seed": 3, **meta})


def build(kind: str, tmp_path, undo, **config):
    if kind == "sglang":
        from verlx.rollout.sglang_engine import SGLangRolloutEngine as cls

        state = install_fake_sglang("0.5.17", str(tmp_path / "dist"))
    else:
        from verlx.rollout.vllm_engine import VLLMRolloutEngine as cls

        state = install_fake_vllm("0.26.0", str(tmp_path / "dist"))
    undo.append(state)
    ctx = make_ctx(str(tmp_path / "model"), load_format="auto", name=kind, mode="async", prompt_length=PROMPT_LENGTH,
                   **config)
    return state, cls(ctx), AgentLoopRunner(ctx.config, TOKENIZER, [EOS], PAD)


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_single_turn_agent_loop_gives_the_synchronous_batch(kind, tmp_path, undo):
    state, engine, runner = build(kind, tmp_path, undo)
    batch = prompts([[5, 6, 7], [9], [3, 4, 5, 6, 7, 1]])
    sync = engine.generate(batch)
    agent = runner.generate(engine, batch)
    assert sorted(sync.batch.keys()) == sorted(agent.batch.keys())
    assert sorted(sync.non_tensor_batch) == sorted(agent.non_tensor_batch) == []
    for key in sync.batch:
        assert sync.batch[key].dtype == agent.batch[key].dtype, key
        torch.testing.assert_close(sync.batch[key], agent.batch[key], rtol=0, atol=1e-6, msg=key)
    assert sync.batch["response_mask"].sum(-1).min() >= 1


def test_sglang_over_sampling_cancels_the_slowest_and_aborts_them(tmp_path, undo):
    state, engine, runner = build("sglang", tmp_path, undo, over_sample_rate=0.5)
    rounds = {10: 2, 11: 12, 12: 4, 13: 10, 14: 6, 15: 8}  # last prompt token -> event-loop rounds to answer
    state.async_rounds = lambda ids: rounds[ids[-1]]
    batch = runner.generate(engine, prompts([[5, last] for last in rounds]))
    lengths = batch.batch["response_mask"].sum(-1).tolist()
    cancelled = [k for k, n in enumerate(lengths) if n == 0]
    assert cancelled == [1, 3, 5]  # keep int(6 × 0.5) = 3: the three slowest (12, 10 and 8 rounds) are cut
    assert [c for c in state.calls if c[0] == "abort_request"] == [("abort_request", "", True)]
    assert batch.batch["attention_mask"][cancelled, PROMPT_LENGTH:].sum() == 0
    uncut = runner.generate(engine, prompts([[5, last] for last in rounds], validate=True))  # never cut
    assert uncut.batch["response_mask"].sum(-1).min() >= 1
    assert len([c for c in state.calls if c[0] == "abort_request"]) == 1


def test_vllm_over_sampling_aborts_the_requests_still_running(tmp_path, undo):
    state, engine, runner = build("vllm", tmp_path, undo, over_sample_rate=0.6)

    def completion(prompt, sample, params):  # the fake finishes a request after 1 + len(tokens) % 3 steps
        tokens = [100 + k for k in range({0: 3, 1: 3, 2: 1, 3: 2, 4: 2, 5: 2}[prompt[-1]])]
        return tokens, [-0.1] * len(tokens), "length"

    state.completion = completion
    batch = runner.generate(engine, prompts([[7, k] for k in range(6)]))  # steps: 1, 1, 2, 3, 3, 3
    lengths = batch.batch["response_mask"].sum(-1).tolist()
    # keep int(6 × 0.4) = 2, both done after step 1: everything else is cancelled; the engine ran one more step
    # (finishing sample 2) before the abort reached it
    assert lengths == [3, 3, 0, 0, 0, 0]
    adds = {c[2][-1]: c[1] for c in state.calls if c[0] == "add_request"}
    assert [c for c in state.calls if c[0] == "abort_request"] == [("abort_request", [adds[3], adds[4], adds[5]])]
    assert [len(c[1]) for c in state.calls if c[0] == "step"] == [6, 4]
