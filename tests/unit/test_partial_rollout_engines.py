"""Partial rollout (trainer.partial_rollout) on sglang and vllm, against the recording stand-ins of their APIs: an
interrupted generation aborts the requests still running in the engine (SGLang: TokenizerManager.abort_request;
vLLM: LLMEngine.abort_request, its requests streaming their new tokens as DELTA outputs), each comes back with
exactly the tokens it had, and the continuation sends prompt + those tokens with the remaining budget and appends
what it generates."""

from __future__ import annotations

import pytest
import torch

from engine_fakes.contexts import PAD, make_ctx
from engine_fakes.fake_sglang import install_fake_sglang
from engine_fakes.fake_vllm import RequestOutputKind, install_fake_vllm
from verlx.protocol import DataProto
from verlx.rollout.generation import Interruptions

RESPONSE = 6


def tokens_of(prompt: list[int], sample: int, params: dict) -> tuple[list[int], list[float], str]:
    """Every request runs to its budget: token k of a context is (sum of the context + k) % 50 + 10."""
    n = params["max_new_tokens"]
    tokens = [(sum(prompt) + k) % 50 + 10 for k in range(n)]
    return tokens, [-(len(prompt) + k) / 100 for k in range(n)], "length"


def build(kind: str, tmp_path, undo):
    if kind == "sglang":
        from verlx.rollout.sglang_engine import SGLangRolloutEngine as cls

        state = install_fake_sglang("0.5.17", str(tmp_path / "dist"))
        state.async_rounds = lambda ids: {5: 2, 9: 12}[ids[0]]  # row 0 answers at once, row 1 takes long
    else:
        from verlx.rollout.vllm_engine import VLLMRolloutEngine as cls

        state = install_fake_vllm("0.26.0", str(tmp_path / "dist"))
        state.steps_of = lambda n: n  # one token per step, like a real engine
    state.completion = tokens_of
    undo.append(state)
    return state, cls(make_ctx(str(tmp_path / "model"), load_format="auto", name=kind, response_length=RESPONSE))


def prompts(rows: list[list[int]], partial: list[list[int]] | None = None) -> DataProto:
    ids = torch.full((len(rows), 4), PAD)
    mask = torch.zeros(len(rows), 4, dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, 4 - len(row):] = torch.tensor(row)
        mask[i, 4 - len(row):] = 1
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)}
    if partial is not None:
        responses = torch.full((len(rows), RESPONSE), PAD)
        log_probs = torch.zeros(len(rows), RESPONSE)
        for i, done in enumerate(partial):
            responses[i, : len(done)] = torch.tensor(done)
            log_probs[i, : len(done)] = -0.5
        batch.update(partial_responses=responses, partial_log_probs=log_probs,
                     partial_lengths=torch.tensor([len(d) for d in partial]))
    return DataProto(batch, meta_info={"do_sample": True, "seed": 3, "generation_id": 0})


def after_steps(count: int):
    """An interruption that comes once `count` steps have run (asked before every step)."""
    asked = {"n": 0}

    def interrupted() -> bool:
        asked["n"] += 1
        return asked["n"] > count

    return interrupted


def response(out: DataProto, row: int) -> list[int]:
    return out.batch["responses"][row][out.batch["response_mask"][row].bool()].tolist()


@pytest.mark.parametrize("kind", ["sglang", "vllm"])
def test_an_interrupted_generation_keeps_its_tokens_and_continues_from_them(kind, tmp_path, undo):
    state, engine = build(kind, tmp_path, undo)
    rows = [[5, 6, 7], [9, 4]]
    # sglang: the first step returns once row 0 has answered; vllm: two steps, one token each
    first = engine.generate(prompts(rows), after_steps(1 if kind == "sglang" else 2))
    full = [tokens_of(r, 0, {"max_new_tokens": RESPONSE})[0] for r in rows]
    finished = first.batch["rollout_finished"].tolist()
    kept = [response(first, r) for r in range(2)]
    assert finished[1] is False and 0 < len(kept[1]) < RESPONSE and kept[1] == full[1][: len(kept[1])]
    assert first.batch["rollout_new_tokens"].tolist() == [len(kept[0]), len(kept[1])]
    lps = first.batch["rollout_log_probs"][1][: len(kept[1])].tolist()
    assert lps == pytest.approx([-(2 + k) / 100 for k in range(len(kept[1]))])
    if kind == "sglang":
        assert finished[0] is True and kept[0] == full[0]  # answered before the interruption
        assert [c for c in state.calls if c[0] == "abort_request"] == [("abort_request", "", True)]
    else:
        assert finished == [False, False] and len(kept[0]) == 2  # two steps, one token each
        adds = [c for c in state.calls if c[0] == "add_request"]
        assert all(c[4] is RequestOutputKind.DELTA for c in adds)
        assert [c for c in state.calls if c[0] == "abort_request"] == [("abort_request", [c[1] for c in adds])]

    state.calls.clear()
    unfinished = [i for i in range(2) if not finished[i]]  # what the pipeline continues
    rest = engine.generate(prompts([rows[i] for i in unfinished], partial=[kept[i] for i in unfinished]),
                           Interruptions().check(1))
    requests = [c for c in state.calls if c[0] in ("async_generate", "add_request")]
    assert [c[1] if kind == "sglang" else c[2] for c in requests] == [rows[i] + kept[i] for i in unfinished]
    budgets = [c[2]["max_new_tokens"] if kind == "sglang" else c[3]["max_tokens"] for c in requests]
    assert budgets == [RESPONSE - len(kept[i]) for i in unfinished]
    for j, i in enumerate(unfinished):
        continued = tokens_of(rows[i] + kept[i], 0, {"max_new_tokens": RESPONSE - len(kept[i])})[0]
        assert response(rest, j) == kept[i] + continued
        assert rest.batch["rollout_finished"][j] and rest.batch["rollout_new_tokens"][j] == len(continued)
        # earlier tokens keep the log-probs they came with
        assert rest.batch["rollout_log_probs"][j][: len(kept[i])].tolist() == [-0.5] * len(kept[i])


def test_an_engine_without_partial_rollout_is_named_with_the_capability():
    from verlx.config.loader import build as build_config
    from verlx.config.loader import load_yaml, to_container
    from verlx.config.schema import PPOConfig
    from verlx.rollout.capabilities import capability_problems

    cfg = build_config(PPOConfig, to_container(load_yaml(overrides=[
        "trainer.partial_rollout=true", "actor_rollout_ref.rollout.name=helpers.faulty_engines:SlowEngine"])))
    (problem,) = capability_problems(cfg)
    assert problem.startswith("trainer.partial_rollout=true needs a rollout engine that can pause a generation and "
                              "continue it with new weights, but actor_rollout_ref.rollout.name=helpers.faulty_engines"
                              ":SlowEngine cannot (SlowEngine.supports_partial_rollout is False); use ")
    assert "actor_rollout_ref.rollout.name=sglang" in problem and "actor_rollout_ref.rollout.name=vllm" in problem


def test_sglang_requests_cancelled_before_they_reach_the_engine_are_dropped(tmp_path, undo):
    """An interruption before the first step: the engine never receives the requests (an abort could not reach
    them), and every row comes back unfinished with no token."""
    state, engine = build("sglang", tmp_path, undo)
    out = engine.generate(prompts([[5, 6, 7], [9, 4]]), lambda: True)
    assert out.batch["rollout_finished"].tolist() == [False, False]
    assert out.batch["rollout_new_tokens"].tolist() == [0, 0] and out.batch["response_mask"].sum() == 0
    assert not [c for c in state.calls if c[0] in ("async_generate", "abort_request")]
