"""Template round trips: trajectories built by the agent loop with Qwen2.5-, Llama-3- and Qwen3-style templates
(written for these tests) agree with the full re-tokenisation of the final conversation: zero mismatches. The
Qwen3-style template drops earlier turns' thinking, which breaks naive re-tokenisation: the check counts that as
a rewrite of the model's own turn, not as a mismatch."""

from __future__ import annotations

import json

import pytest

from helpers.chat_templates import STOP_TOKENS, build_chat_tokenizer
from helpers.scripted_policy import ScriptedStream, prompt_batch, rollout_config
from verlx.rollout.agent.builtin_tools import calculator
from verlx.rollout.agent.chat import ChatCodec
from verlx.rollout.agent.loops import AGENT_LOOPS, ToolAgentLoop
from verlx.rollout.agent.runner import AgentLoopRunner
from verlx.rollout.agent.tools import FunctionTool, schema_from_function

TOOLS = {"calculator": FunctionTool(calculator, schema_from_function(calculator))}
QUESTION = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": "What is 12*34+5?"}]


class OneFollowUp(ToolAgentLoop):
    """A simulated user who asks one follow-up question."""

    async def user_reply(self, sample):
        return "And times 2?"


AGENT_LOOPS.register("test_one_follow_up", override=True)(OneFollowUp)


def hermes(expression):
    return f'<tool_call>\n{json.dumps({"name": "calculator", "arguments": {"expression": expression}})}\n</tool_call>'


def llama(expression):
    return json.dumps({"name": "calculator", "parameters": {"expression": expression}})


# per template: model turns, and the hand-written text the template puts after each non-final model turn
CASES = {
    "qwen25": ("hermes", [hermes("12*34") + "<|im_end|>", hermes("408+5") + "<|im_end|>", "413<|im_end|>"],
               ["\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
                "\n<|im_start|>user\n<tool_response>\n413\n</tool_response><|im_end|>\n<|im_start|>assistant\n"]),
    "llama3": ("llama3_json", [llama("12*34") + "<|eot_id|>", llama("408+5") + "<|eot_id|>", "413<|eot_id|>"],
               ["<|start_header_id|>ipython<|end_header_id|>\n\n408<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n",
                "<|start_header_id|>ipython<|end_header_id|>\n\n413<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n"]),
    "qwen3": ("hermes", ["<think>\nmultiply first\n</think>\n\n" + hermes("12*34") + "<|im_end|>",
                         "<think>\nnow add\n</think>\n\n" + hermes("408+5") + "<|im_end|>",
                         "<think>\ndone\n</think>\n\n413<|im_end|>"],
              ["\n<|im_start|>user\n<tool_response>\n408\n</tool_response><|im_end|>\n<|im_start|>assistant\n",
               "\n<|im_start|>user\n<tool_response>\n413\n</tool_response><|im_end|>\n<|im_start|>assistant\n"]),
}


def enc(tok, text):
    return tok(text, add_special_tokens=False)["input_ids"]


def run(template, turns, agent="tool_agent", template_kwargs=None, **mt):
    tok = build_chat_tokenizer(template)
    stop = tok.convert_tokens_to_ids(STOP_TOKENS[template])
    backend = ScriptedStream({0: [enc(tok, t) for t in turns]}, [stop])
    config = rollout_config(default_agent_loop=agent, **mt)
    runner = AgentLoopRunner(config, tok, [stop], tok.pad_token_id, template_kwargs=template_kwargs, tools=TOOLS)
    return tok, backend, runner.generate_with(backend, prompt_batch(tok, [QUESTION]), n=1)


@pytest.mark.parametrize("template", sorted(CASES))
def test_round_trip_has_zero_mismatches(template):
    fmt, turns, deltas = CASES[template]
    tok, backend, batch = run(template, turns, format=fmt)
    want_ids, want_mask = [], []
    for k, turn in enumerate(turns):
        want_ids += enc(tok, turn)
        want_mask += [1] * len(enc(tok, turn))
        if k < len(deltas):
            want_ids += enc(tok, deltas[k])
            want_mask += [0] * len(enc(tok, deltas[k]))
    valid = batch.batch["attention_mask"][0, -512:].bool()
    assert batch.batch["responses"][0][valid].tolist() == want_ids
    assert batch.batch["response_mask"][0][valid].tolist() == want_mask
    nt = batch.non_tensor_batch
    assert (nt["multi_turn_template_mismatch"][0], nt["multi_turn_template_rewrite"][0]) == (False, False)
    assert nt["multi_turn_num_turns"][0] == 3 and nt["multi_turn_tool_calls"][0] == 2
    # and the plain re-tokenisation of the final conversation is the trajectory itself
    prompt = batch.batch["prompts"][0][batch.batch["attention_mask"][0, :-512].bool()].tolist()
    full = tok.apply_chat_template(nt["multi_turn_messages"][0], tools=[TOOLS["calculator"].schema], tokenize=False)
    assert enc(tok, full)[: len(prompt) + len(want_ids)] == prompt + want_ids


@pytest.mark.parametrize("max_user_turns, calls, stop, user_turns", [
    (1, 1, "max_user_turns", 1),  # the first tool results were the one user turn: the second call is not run
    (2, 2, "answered", 2),
    (0, 2, "answered", 2),  # veRL: 0 is no limit
])
def test_tool_results_count_as_user_turns_as_in_verl(max_user_turns, calls, stop, user_turns):
    fmt, turns, _ = CASES["qwen25"]
    _, _, batch = run("qwen25", turns, format=fmt, max_user_turns=max_user_turns)
    nt = batch.non_tensor_batch
    assert (nt["multi_turn_tool_calls"][0], nt["multi_turn_stop_reason"][0]) == (calls, stop)
    assert nt["multi_turn_user_turns"][0] == user_turns


def test_qwen3_dropped_thinking_is_a_rewrite_not_a_mismatch():
    turns = ["<think>\nsmall\n</think>\n\n413<|im_end|>", "<think>\ndouble it\n</think>\n\n826<|im_end|>"]
    tok, backend, batch = run("qwen3", turns, agent="test_one_follow_up", max_user_turns=1)
    nt = batch.non_tensor_batch
    assert nt["multi_turn_stop_reason"][0] == "max_user_turns"
    assert (nt["multi_turn_template_mismatch"][0], nt["multi_turn_template_rewrite"][0]) == (False, True)
    # the model's second turn saw its first turn's thinking (append-only), as the trajectory trains on it
    second_context = backend.requests[1][2]
    assert tok.decode(second_context).endswith("<think>\nsmall\n</think>\n\n413<|im_end|>\n<|im_start|>user\n"
                                               "And times 2?<|im_end|>\n<|im_start|>assistant\n")
    # naive re-tokenisation would lose it: the template renders the first answer without its thinking
    full = tok.apply_chat_template(nt["multi_turn_messages"][0], tools=[TOOLS["calculator"].schema], tokenize=False)
    assert "small" not in full and "double it" in full
    assert batch.batch["response_mask"][0].sum().item() == sum(len(enc(tok, t)) for t in turns)


def test_qwen3_without_thinking_keeps_the_empty_think_block_of_the_generation_prompt():
    turns = [hermes("12*34") + "<|im_end|>", "408<|im_end|>"]
    tok, backend, batch = run("qwen3", turns, format="hermes", template_kwargs={"enable_thinking": False})
    assert tok.decode(backend.requests[1][2]).endswith("</tool_response><|im_end|>\n<|im_start|>assistant\n"
                                                       "<think>\n\n</think>\n\n")
    nt = batch.non_tensor_batch
    assert not nt["multi_turn_template_mismatch"][0]
    # history renders the first turn without the empty block: the model's region differs, the template's does not
    assert nt["multi_turn_template_rewrite"][0]


def test_template_that_rewrites_history_has_no_delta_and_is_counted():
    tok = build_chat_tokenizer("qwen25")
    tok.chat_template = ("{{ 'turns=' + messages|length|string + '\\n' }}"
                         + tok.chat_template)  # the header changes whenever a message is added
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    backend = ScriptedStream({0: [enc(tok, hermes("1+1") + "<|im_end|>"), enc(tok, "2<|im_end|>")]}, [stop])
    runner = AgentLoopRunner(rollout_config(default_agent_loop="tool_agent"), tok, [stop], tok.pad_token_id,
                             tools=TOOLS)
    batch = runner.generate_with(backend, prompt_batch(tok, [QUESTION]), n=1)
    nt = batch.non_tensor_batch
    assert nt["multi_turn_template_mismatch"][0] and nt["multi_turn_stop_reason"][0] == "error"
    assert batch.batch["response_mask"][0].sum().item() == 0


def test_codec_delta_is_independent_of_the_conversation_before_it():
    tok = build_chat_tokenizer("qwen3")
    codec = ChatCodec(tok, None, {}, [tok.convert_tokens_to_ids("<|im_end|>")])
    delta = codec.delta_ids([{"role": "tool", "content": "7"}])
    assert tok.decode(delta) == "\n<|im_start|>user\n<tool_response>\n7\n</tool_response><|im_end|>\n" \
                                "<|im_start|>assistant\n"
