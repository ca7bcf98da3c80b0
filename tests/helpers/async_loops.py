"""Agent loops for the rollout.mode=async end-to-end tests (test-only), named as `helpers.async_loops:Class` in
rollout.agent.default_agent_loop; the Ray workers import them (the tests folder is on their PYTHONPATH).

The tiny random model never writes a tool call nor stops on cue, so these loops decide the turns themselves from
the arithmetic rows' `extra_info.question` ("a+b=?").
"""

from __future__ import annotations

import re

from verlx.rollout.agent.loops import AgentLoop, ToolAgentLoop, record_outcomes
from verlx.rollout.agent.parsers import ParsedTurn, ToolCall

QUESTION = re.compile(r"(\d+)\+(\d+)=\?")


def operands(text: str) -> tuple[int, int]:
    a, b = QUESTION.search(text).groups()
    return int(a), int(b)


def planned_length(question: str) -> int:
    """The response length QuestionLengthLoop asks for: 1..7 tokens, known from the question alone."""
    a, b = operands(question)
    return 1 + (a + b) % 7


class QuestionLengthLoop(AgentLoop):
    """One model turn of planned_length(question) tokens (with rollout.ignore_eos it is exactly that long), so a
    test knows in advance which samples finish first."""

    async def run(self, sample) -> None:
        await sample.generate(planned_length(sample.extra_info["question"]))
        sample.stop("answered")


class CalculatorLoop(AgentLoop):
    """A model turn of up to 3 tokens, a calculator call for the question (made for the model), its result as a
    tool message, a last model turn of up to 3 tokens."""

    uses_tools = True

    async def run(self, sample) -> None:
        if await sample.generate(3) is None:
            return
        a, b = operands(sample.extra_info["question"])
        outcomes = await self.env.executor.run(ParsedTurn(calls=[ToolCall("calculator", {"expression": f"{a}+{b}"})]),
                                               sample.tools_kwargs)
        record_outcomes(sample.trajectory, outcomes)
        if sample.append_messages([{"role": "tool", "content": o.text} for o in outcomes]):
            await sample.generate(3)
            sample.stop("answered")


class ThreeTokenLoop(AgentLoop):
    """One model turn of at most 3 tokens (named in an agent loop config file by the tests)."""

    async def run(self, sample) -> None:
        await sample.generate(3)
        sample.stop("answered")


class ShortTurnsWithUser(ToolAgentLoop):
    """Model turns of at most 3 tokens, each followed by the tool_agent loop's user turn (the row's interaction),
    until the user or a limit ends the conversation."""

    async def run(self, sample) -> None:
        while await sample.generate(3) is not None and await self.user_turn(sample):
            pass
        sample.stop("answered")
