"""Multi-turn agent loops over the request streams of sglang and vllm, driven against the recording stand-ins of
their documented APIs (Engine.async_generate on the engine's loop; LLMEngine.add_request/step with FINAL_ONLY
outputs): the requests each turn sends, and the trajectories that come back, exactly; a refused request loses its
sample and an engine failure fails the batch."""

from __future__ import annotations

import multiprocessing as mp

import pytest

from engine_fakes.contexts import EOS, PAD, make_ctx
from engine_fakes.fake_sglang import install_fake_sglang
from engine_fakes.fake_vllm import RequestOutputKind, install_fake_vllm
from helpers.chat_templates import build_chat_tokenizer
from helpers.scripted_policy import prompt_batch
from verlx.config.roles import AgentLoopConfig, MultiTurnConfig
from verlx.rollout.agent.builtin_tools import calculator
from verlx.rollout.agent.runner import AgentLoopRunner
from verlx.rollout.agent.tools import FunctionTool, schema_from_function
from verlx.rollout.base import SamplingParams
from verlx.rollout.stream import Finished, RequestStream, StreamLimits

TOOLS = {"calculator": FunctionTool(calculator, schema_from_function(calculator))}
TOK = build_chat_tokenizer("qwen25")
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12*34"}}\n</tool_call><|im_end|>'
ANSWER = "It is 408.<|im_end|>"
DELTA = "\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
RESPONSE_LENGTH = 200


def enc(text):
    return TOK(text, add_special_tokens=False)["input_ids"]


def scripted(prompt, sample, params):
    """The stand-in engine's model: call the calculator first, answer once a tool response is in the context."""
    tokens = enc(ANSWER if TOK.convert_tokens_to_ids("<tool_response>") in prompt else CALL)
    tokens = tokens[: params["max_new_tokens"]]
    return tokens, [-0.5 - k / 100 for k in range(len(tokens))], "stop" if tokens[-1] == EOS else "length"


@pytest.fixture
def undo():
    states = []
    start_method = mp.get_start_method(allow_none=True)
    yield states
    for state in reversed(states):  # last in, first out: a second install saved the first as what to restore
        state.undo()
    mp.set_start_method(start_method, force=True)


def multi_turn_ctx(tmp_path, name):
    assert TOK.convert_tokens_to_ids("<|im_end|>") == EOS and TOK.pad_token_id == PAD
    ctx = make_ctx(str(tmp_path / "model"), load_format="auto", prompt_length=2048, response_length=RESPONSE_LENGTH,
                   name=name)
    ctx.config.multi_turn = MultiTurnConfig(enable=True)
    ctx.config.agent = AgentLoopConfig(default_agent_loop="tool_agent")
    return ctx


def run(engine, ctx, rows=2):
    runner = AgentLoopRunner(ctx.config, TOK, [EOS], PAD, tools=TOOLS)
    question = [{"role": "user", "content": "What is 12*34?"}]
    return runner.generate(engine, prompt_batch(TOK, [question] * rows, width=2048))


def prompt_ids():
    text = TOK.apply_chat_template([{"role": "user", "content": "What is 12*34?"}],
                                   tools=[TOOLS["calculator"].schema], add_generation_prompt=True, tokenize=False)
    return enc(text)


def check_trajectories(batch, rows):
    want = enc(CALL) + enc(DELTA) + enc(ANSWER)
    mask = [1] * len(enc(CALL)) + [0] * len(enc(DELTA)) + [1] * len(enc(ANSWER))
    for row in range(rows):
        valid = batch.batch["attention_mask"][row, -RESPONSE_LENGTH:].bool()
        assert batch.batch["responses"][row][valid].tolist() == want
        assert batch.batch["response_mask"][row][valid].tolist() == mask
        assert batch.non_tensor_batch["multi_turn_tool_calls"][row] == 1
    lps = batch.batch["rollout_log_probs"][0][: len(want)].tolist()
    assert lps[: len(enc(CALL))] == pytest.approx([-0.5 - k / 100 for k in range(len(enc(CALL)))])
    assert lps[len(enc(CALL)): len(enc(CALL)) + len(enc(DELTA))] == [0.0] * len(enc(DELTA))


def test_sglang_async_generate_per_turn_on_the_engine_loop(tmp_path, undo):
    from verlx.rollout.sglang_engine import SGLangRolloutEngine

    state = install_fake_sglang("0.5.17", str(tmp_path / "dist"))
    undo.append(state)
    state.completion = scripted
    ctx = multi_turn_ctx(tmp_path, "sglang")
    engine = SGLangRolloutEngine(ctx)
    batch = run(engine, ctx)
    check_trajectories(batch, 2)
    requests = [c for c in state.calls if c[0] == "async_generate"]
    assert len(requests) == 4 and not any(c[0] == "generate" for c in state.calls)
    first = [c for c in requests if c[1] == prompt_ids()]
    second = [c for c in requests if c[1] == prompt_ids() + enc(CALL) + enc(DELTA)]
    assert len(first) == 2 and len(second) == 2
    assert first[0][2]["max_new_tokens"] == RESPONSE_LENGTH and first[0][3] is True
    assert second[0][2]["max_new_tokens"] == RESPONSE_LENGTH - len(enc(CALL)) - len(enc(DELTA))
    assert first[0][2]["n"] == 1 and first[0][2]["stop_token_ids"] == [EOS] and first[0][2]["no_stop_trim"]


def test_vllm_requests_join_as_samples_return_from_tools(tmp_path, undo, monkeypatch):
    from verlx.rollout.vllm_engine import VLLMRolloutEngine

    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    state = install_fake_vllm("0.26.0", str(tmp_path / "dist"))
    undo.append(state)
    state.completion = scripted
    ctx = multi_turn_ctx(tmp_path, "vllm")
    engine = VLLMRolloutEngine(ctx)
    batch = run(engine, ctx, rows=3)
    check_trajectories(batch, 3)
    adds = [c for c in state.calls if c[0] == "add_request"]
    assert len(adds) == 6 and all(c[4] is RequestOutputKind.FINAL_ONLY for c in adds)
    assert [c[3]["max_tokens"] for c in adds[:3]] == [RESPONSE_LENGTH] * 3
    assert all(c[3]["logprobs"] == 0 and c[3]["n"] == 1 for c in adds)
    assert len({c[1] for c in adds}) == 6  # every turn is its own request
    # turn-2 requests were added while other requests were still running in the engine
    steps = [c for c in state.calls if c[0] in ("step", "add_request")]
    second_turn = [i for i, c in enumerate(steps) if c[0] == "add_request" and len(c[2]) > len(prompt_ids())]
    assert any(steps[i + 1][0] == "step" and len(steps[i + 1][1]) > 1 for i in second_turn)
    assert not any(c[0] == "generate" for c in state.calls)


class FlakyStream(RequestStream):
    """An engine double: answers ANSWER at once; refuses sample 1's request; can fail at a given step."""

    def __init__(self, fail_at_step=None):
        super().__init__(SamplingParams(), StreamLimits(64, 10**6), want_log_probs=False)
        self.fail_at_step, self.steps, self.live = fail_at_step, 0, []

    def _submit(self, key, prompt_ids, max_new_tokens, seed, follows):
        if key.startswith("1/"):
            raise ValueError("request refused")
        self.live.append(key)

    def _step(self):
        self.steps += 1
        if self.steps == self.fail_at_step:
            raise RuntimeError("device lost")
        done, self.live = self.live, []
        return [Finished(key, enc(ANSWER), None, "stop") for key in done]

    def _cancel(self, keys):
        self.live = [key for key in self.live if key not in keys]
        return [Finished(key, [], None, "abort") for key in keys]


def test_a_refused_request_loses_its_sample_and_an_engine_failure_fails_the_batch(tmp_path):
    ctx_config = make_ctx(str(tmp_path / "model"), prompt_length=2048, response_length=64).config
    ctx_config.multi_turn = MultiTurnConfig(enable=True)
    runner = AgentLoopRunner(ctx_config, TOK, [EOS], PAD, tools=TOOLS)
    question = [{"role": "user", "content": "What is 12*34?"}]
    batch = runner.generate_with(FlakyStream(), prompt_batch(TOK, [question] * 3, width=2048), n=1)
    assert list(batch.non_tensor_batch["multi_turn_stop_reason"]) == ["answered", "error", "answered"]
    assert batch.batch["response_mask"][1].sum() == 0
    with pytest.raises(RuntimeError, match="rollout engine failed .*device lost"):
        runner.generate_with(FlakyStream(fail_at_step=1), prompt_batch(TOK, [question] * 3, width=2048), n=1)
