"""The agent loop with a scripted policy: token ids, response_mask, rollout log-probs and the template check,
exactly, for one and several tool calls, parallel calls, tool errors, timeouts, malformed calls, truncation
mid-turn, a tool response over the budget and max turns."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest

from helpers.chat_templates import build_chat_tokenizer
from helpers.scripted_policy import (
    ScriptedStream,
    assert_row,
    enc,
    prompt_batch,
    response,
    rollout_config,
    scripted_response,
)
from verlx.rollout.agent.builtin_tools import calculator
from verlx.rollout.agent.runner import AgentLoopRunner, TemplateMismatchError
from verlx.rollout.agent.tools import FunctionTool, schema_from_function

QUESTION = [{"role": "user", "content": "What is 12*34?"}]
TOOLS = {"calculator": FunctionTool(calculator, schema_from_function(calculator))}


@pytest.fixture(scope="module")
def tok():
    return build_chat_tokenizer("qwen25")



def call(expression: str, name: str = "calculator") -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": {"expression": expression}})}\n</tool_call>'


def tool_delta(*results: str) -> str:
    """What the Qwen2.5-style template puts after <|im_end|> for these tool results (written out by hand)."""
    body = "".join(f"\n<tool_response>\n{r}\n</tool_response>" for r in results)
    return f"\n<|im_start|>user{body}<|im_end|>\n<|im_start|>assistant\n"


def run(tok, turns_text, tools=TOOLS, conversations=None, response_length=512, extra_infos=None, **mt):
    conversations = conversations or [QUESTION] * len(turns_text)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    turns = {k: [enc(tok, t) for t in texts] for k, texts in enumerate(turns_text)}
    backend = ScriptedStream(turns, [stop])
    mt.setdefault("default_agent_loop", "tool_agent")
    runner = AgentLoopRunner(rollout_config(response_length=response_length, **mt), tok, [stop],
                             tok.pad_token_id, tools=tools)
    batch = runner.generate_with(backend, prompt_batch(tok, conversations, extra_infos=extra_infos), n=1)
    return batch, backend, runner


def prompt_with_tools(tok, runner, messages=QUESTION) -> list[int]:
    text = tok.apply_chat_template(messages, tools=[t.schema for t in runner.tools.values()],
                                   add_generation_prompt=True, tokenize=False)
    return enc(tok, text)


def test_one_tool_call_is_token_exact(tok):
    model1 = call("12*34") + "<|im_end|>"
    model2 = "It is 408.<|im_end|>"
    batch, backend, runner = run(tok, [[model1, model2]])
    prompt = prompt_with_tools(tok, runner)
    delta = tool_delta("408")
    assert_row(batch, 0, scripted_response(tok, [(model1, True), (delta, False), (model2, True)]))
    # the prompt was rendered with the tool schema; the second request saw exactly the trajectory so far
    assert batch.batch["prompts"][0][batch.batch["attention_mask"][0, :2048].bool()].tolist() == prompt
    assert [r[2] for r in backend.requests] == [prompt, prompt + enc(tok, model1) + enc(tok, delta)]
    assert backend.requests[1][3] == 512 - len(enc(tok, model1)) - len(enc(tok, delta))
    nt = batch.non_tensor_batch
    assert (nt["multi_turn_num_turns"][0], nt["multi_turn_tool_calls"][0], nt["multi_turn_stop_reason"][0]) == \
        (2, 1, "answered")
    assert not nt["multi_turn_template_mismatch"][0] and not nt["multi_turn_template_rewrite"][0]
    assert nt["multi_turn_messages"][0][-2:] == [{"role": "tool", "content": "408"},
                                                  {"role": "assistant", "content": "It is 408."}]
    # attention covers tool tokens; positions run on through them
    width = batch.batch["prompts"].shape[1]
    n_real = len(prompt) + len(response(batch, 0)[0])
    assert batch.batch["attention_mask"][0].sum().item() == n_real
    pos = batch.batch["position_ids"][0][batch.batch["attention_mask"][0].bool()]
    assert pos.tolist() == list(range(n_real))
    assert batch.batch["input_ids"].shape[1] == width + 512


def test_several_tool_calls_in_a_row(tok):
    turns = [call("12*34") + "<|im_end|>", call("408+1") + "<|im_end|>", call("409*2") + "<|im_end|>",
             "818<|im_end|>"]
    batch, backend, _ = run(tok, [turns])
    want = scripted_response(tok, [(turns[0], True), (tool_delta("408"), False), (turns[1], True),
                                   (tool_delta("409"), False), (turns[2], True), (tool_delta("818"), False),
                                   (turns[3], True)])
    assert_row(batch, 0, want)
    assert batch.non_tensor_batch["multi_turn_num_turns"][0] == 4
    assert batch.non_tensor_batch["multi_turn_tool_calls"][0] == 3
    assert not batch.non_tensor_batch["multi_turn_template_mismatch"][0]


def test_parallel_calls_run_concurrently(tok):
    both_started = threading.Barrier(2, timeout=5)

    def meet(x: str) -> str:
        """Wait for the other call.

        Args:
            x: a label
        """
        both_started.wait()  # a sequential executor would break the barrier after 5 s
        return f"met {x}"

    tools = {"meet": FunctionTool(meet, schema_from_function(meet))}
    calls = "".join(f'<tool_call>\n{{"name": "meet", "arguments": {{"x": "{x}"}}}}\n</tool_call>' for x in "ab")
    turns = [calls + "<|im_end|>", "done<|im_end|>"]
    batch, _, _ = run(tok, [turns], tools=tools, max_parallel_calls=2)
    assert_row(batch, 0, scripted_response(tok, [(turns[0], True), (tool_delta("met a", "met b"), False),
                                                 (turns[1], True)]))
    assert batch.non_tensor_batch["multi_turn_tool_errors"][0] == 0


def test_calls_beyond_max_parallel_calls_are_answered_not_run(tok):
    turns = [call("1+1") + call("2+2") + "<|im_end|>", "ok<|im_end|>"]
    batch, _, _ = run(tok, [turns], max_parallel_calls=1)
    refused = "error: at most 1 tool calls per turn; this call was not run"
    assert_row(batch, 0, scripted_response(tok, [(turns[0], True), (tool_delta("2", refused), False),
                                                 (turns[1], True)]))
    assert batch.non_tensor_batch["multi_turn_tool_errors"][0] == 1


def test_tool_error_timeout_and_bad_returns_are_counted_and_the_batch_goes_on(tok):
    def boom(x: str) -> str:
        """Raise.

        Args:
            x: anything
        """
        raise RuntimeError("tool exploded")

    def slow(x: str) -> str:
        """Hang.

        Args:
            x: anything
        """
        time.sleep(3)
        return "late"

    def number(x: str) -> str:
        """Return a number instead of text.

        Args:
            x: anything
        """
        return 42

    def flood(x: str) -> str:
        """Print a lot.

        Args:
            x: anything
        """
        return "y" * 10000

    tools = {f.__name__: FunctionTool(f, schema_from_function(f)) for f in (boom, slow, number, flood)}
    tools.update(TOOLS)

    def turn(name):
        return f'<tool_call>\n{{"name": "{name}", "arguments": {{"x": "1"}}}}\n</tool_call><|im_end|>'

    scripts = [[turn(n), "fine<|im_end|>"] for n in ("boom", "slow", "number", "flood")]
    scripts.append([call("6*7") + "<|im_end|>", "42<|im_end|>"])
    start = time.perf_counter()
    batch, _, _ = run(tok, scripts, tools=tools, tool_timeout_s=0.3, max_tool_response_length=64)
    assert time.perf_counter() - start < 2.5  # the hung tool did not hold the batch for its 3 s
    answers = ["error: boom raised RuntimeError: tool exploded", "error: slow did not answer within 0.3 s",
               "error: number returned int, not text", "y" * 23 + "...(truncated)..." + "y" * 24, "42"]
    for row, (script, answer) in enumerate(zip(scripts, answers)):
        assert_row(batch, row, scripted_response(tok, [(script[0], True), (tool_delta(answer), False),
                                                       (script[1], True)]))
    nt = batch.non_tensor_batch
    assert list(nt["multi_turn_tool_errors"]) == [1, 0, 1, 0, 0]
    assert list(nt["multi_turn_tool_timeouts"]) == [0, 1, 0, 0, 0]
    assert list(nt["multi_turn_tool_truncated"]) == [0, 0, 0, 1, 0]
    assert not any(nt["multi_turn_template_mismatch"])


def test_malformed_call_and_unknown_tool_and_bad_arguments(tok):
    scripts = [['<tool_call>\n{"name": "calculator", "arguments": {</tool_call><|im_end|>', "sorry<|im_end|>"],
               ['<tool_call>\n{"name": "search", "arguments": {}}\n</tool_call><|im_end|>', "sorry<|im_end|>"],
               ['<tool_call>\n{"name": "calculator", "arguments": {"expr": "1"}}\n</tool_call><|im_end|>',
                "sorry<|im_end|>"]]
    batch, _, _ = run(tok, scripts)
    nt = batch.non_tensor_batch
    assert list(nt["multi_turn_tool_malformed"]) == [1, 0, 0]
    assert list(nt["multi_turn_tool_errors"]) == [0, 1, 1]
    texts = [nt["multi_turn_messages"][k][-2]["content"] for k in range(3)]
    assert texts[0].startswith("error: malformed tool call: not valid JSON")
    assert texts[1] == "error: unknown tool 'search'; available: ['calculator']"
    assert texts[2] == "error: calculator: missing required argument(s) ['expression']"
    for row, script in enumerate(scripts):
        assert_row(batch, row, scripted_response(tok, [(script[0], True), (tool_delta(texts[row]), False),
                                                       (script[1], True)]))


def test_truncation_mid_turn_keeps_the_cut_turn_and_records_length(tok):
    turns = [call("12*34") + "<|im_end|>", "The answer is " + "4" * 200 + "<|im_end|>"]
    first, delta = enc(tok, turns[0]), enc(tok, tool_delta("408"))
    budget = len(first) + len(delta) + 20
    batch, backend, _ = run(tok, [turns], response_length=budget)
    cut = tok.decode(enc(tok, turns[1])[:20])
    assert_row(batch, 0, scripted_response(tok, [(turns[0], True), (tool_delta("408"), False), (cut, True)]))
    assert backend.requests[1][3] == 20
    assert batch.non_tensor_batch["multi_turn_stop_reason"][0] == "length"
    assert not batch.non_tensor_batch["multi_turn_template_mismatch"][0]


def test_tool_response_over_the_budget_ends_at_the_turn_boundary(tok):
    turns = [call("12*34") + "<|im_end|>", "never<|im_end|>"]
    first, delta = enc(tok, turns[0]), enc(tok, tool_delta("408"))
    batch, backend, _ = run(tok, [turns], response_length=len(first) + len(delta))  # no room for a model token
    assert_row(batch, 0, scripted_response(tok, [(turns[0], True)]))
    assert len(backend.requests) == 1
    assert batch.non_tensor_batch["multi_turn_stop_reason"][0] == "context_over_budget"


def test_max_assistant_turns_stops_a_model_that_never_stops_calling(tok):
    turn = call("1+1") + "<|im_end|>"
    batch, backend, _ = run(tok, [[turn]], max_assistant_turns=3)
    assert_row(batch, 0, scripted_response(tok, [(turn, True), (tool_delta("2"), False), (turn, True),
                                                 (tool_delta("2"), False), (turn, True)]))
    assert len(backend.requests) == 3
    nt = batch.non_tensor_batch
    assert (nt["multi_turn_stop_reason"][0], nt["multi_turn_tool_calls"][0]) == ("max_assistant_turns", 2)


def test_single_turn_loop_uses_the_dataset_prompt_unchanged(tok):
    answer = "408<|im_end|>"
    batch, backend, _ = run(tok, [[answer]], default_agent_loop="single_turn_agent")
    data_prompt = enc(tok, tok.apply_chat_template(QUESTION, add_generation_prompt=True, tokenize=False))
    assert backend.requests[0][2] == data_prompt
    assert_row(batch, 0, scripted_response(tok, [(answer, True)]))
    assert batch.non_tensor_batch["multi_turn_stop_reason"][0] == "answered"


def test_tools_kwargs_reach_the_tool_but_not_the_schema(tok):
    def check(answer: str, *, ground_truth: str = "?") -> str:
        """Check an answer.

        Args:
            answer: the proposed answer
        """
        return "correct" if answer == ground_truth else "wrong"

    tool = FunctionTool(check, schema_from_function(check))
    assert list(tool.schema["function"]["parameters"]["properties"]) == ["answer"]
    turns = ['<tool_call>\n{"name": "check", "arguments": {"answer": "408"}}\n</tool_call><|im_end|>', "ok<|im_end|>"]
    extra = [{"tools_kwargs": {"check": {"ground_truth": "408"}}}, {"tools_kwargs": {"check": {"ground_truth": "1"}}}]
    batch, _, _ = run(tok, [turns, turns], tools={"check": tool}, extra_infos=extra)
    assert [m[-2]["content"] for m in batch.non_tensor_batch["multi_turn_messages"]] == ["correct", "wrong"]


def test_a_wrong_delta_is_counted_as_mismatch_and_masked(tok, monkeypatch):
    from verlx.rollout.agent import chat

    real = chat.ChatCodec.delta_ids
    monkeypatch.setattr(chat.ChatCodec, "delta_ids", lambda self, m, **k: real(self, m, **k)[1:])  # drop the "\n"
    turns = [call("12*34") + "<|im_end|>", "It is 408.<|im_end|>"]
    batch, _, _ = run(tok, [turns, ["408<|im_end|>"]])
    nt = batch.non_tensor_batch
    assert list(nt["multi_turn_template_mismatch"]) == [True, False]
    assert batch.batch["response_mask"][0].sum().item() == 0  # excluded from training
    assert batch.batch["response_mask"][1].sum().item() == len(enc(tok, "408<|im_end|>"))
    with pytest.raises(TemplateMismatchError, match="re-tokenisation"):
        run(tok, [turns], on_template_mismatch="error")


def test_async_function_and_sandboxed_python_tools_run_on_the_event_loop(tok):
    from verlx.rollout.agent.builtin_tools import PythonTool

    async def lookup(city: str) -> str:
        """Look a city up.

        Args:
            city: the city
        """
        await asyncio.sleep(0.01)
        return f"{city}: 12 degrees"

    tools = {"lookup": FunctionTool(lookup, schema_from_function(lookup)), "python": PythonTool({"wall_s": 10})}
    assert tools["lookup"].is_async and tools["python"].is_async
    scripts = [['<tool_call>\n{"name": "lookup", "arguments": {"city": "Oslo"}}\n</tool_call><|im_end|>',
                "ok<|im_end|>"],
               ['<tool_call>\n{"name": "python", "arguments": {"code": "print(6*7)"}}\n</tool_call><|im_end|>',
                "42<|im_end|>"]]
    batch, _, _ = run(tok, scripts, tools=tools)
    assert [m[-2]["content"] for m in batch.non_tensor_batch["multi_turn_messages"]] == ["Oslo: 12 degrees", "42\n"]
    assert list(batch.non_tensor_batch["multi_turn_tool_errors"]) == [0, 0]
