"""Run one turn's tool calls concurrently, each with a timeout; every failure becomes text for the model.

A tool that raises, returns something other than text, runs past the timeout or floods its output is counted
(ToolOutcome.status / truncated) and answered with an error message; the other samples of the batch go on.
Sync tools run in a thread pool (a sync tool that hangs keeps its thread until it returns: the sample moves on
after the timeout, but Python cannot stop the thread; put code that can hang into the `python` sandbox tool or
write the tool as a coroutine). Calls beyond max_parallel_calls in one turn are not run and say so.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from verlx.rollout.agent.parsers import ParsedTurn, ToolCall
from verlx.rollout.agent.tools import BaseTool, ToolResult, check_arguments

TRUNCATION_MARK = "...(truncated)..."


@dataclass
class ToolOutcome:
    name: str
    text: str
    status: str  # ok | error | timeout | malformed
    latency_s: float = 0.0
    truncated: bool = False


def truncate_text(text: str, limit: int, side: str) -> tuple[str, bool]:
    """At most `limit` characters, cut on `side` (left keeps the end, right keeps the start, middle both ends)."""
    if len(text) <= limit:
        return text, False
    keep = max(limit - len(TRUNCATION_MARK), 0)
    if side == "left":
        return TRUNCATION_MARK + text[len(text) - keep:], True
    if side == "right":
        return text[:keep] + TRUNCATION_MARK, True
    head = keep // 2
    return text[:head] + TRUNCATION_MARK + text[len(text) - (keep - head):], True


class ToolExecutor:
    def __init__(self, tools: dict[str, BaseTool], timeout_s: float, max_parallel_calls: int,
                 max_response_chars: int, truncate_side: str = "middle", threads: int = 32):
        self.tools = tools
        self.timeout_s = float(timeout_s)
        self.max_parallel_calls = int(max_parallel_calls)
        self.max_response_chars = int(max_response_chars)
        self.truncate_side = truncate_side
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="verlx-tool")

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)

    async def run(self, parsed: ParsedTurn, tools_kwargs: dict | None) -> list[ToolOutcome]:
        """Outcomes in the order the model wrote the calls (malformed ones last)."""
        calls = parsed.calls[: self.max_parallel_calls]
        outcomes = list(await asyncio.gather(*(self._one(c, tools_kwargs or {}) for c in calls)))
        for call in parsed.calls[self.max_parallel_calls:]:
            outcomes.append(ToolOutcome(call.name, f"error: at most {self.max_parallel_calls} tool calls per turn; "
                                                   "this call was not run", "error"))
        for why in parsed.malformed:
            outcomes.append(ToolOutcome("", f"error: malformed tool call: {why}", "malformed"))
        return outcomes

    async def _one(self, call: ToolCall, tools_kwargs: dict) -> ToolOutcome:
        tool = self.tools.get(call.name)
        if tool is None:
            return ToolOutcome(call.name, f"error: unknown tool {call.name!r}; available: {sorted(self.tools)}",
                               "error")
        problem = check_arguments(tool.schema, call.arguments)
        if problem is not None:
            return ToolOutcome(call.name, f"error: {call.name}: {problem}", "error")
        own_kwargs = tools_kwargs.get(call.name) or {}
        start = time.perf_counter()
        try:
            result = await asyncio.wait_for(self._execute(tool, call.arguments, own_kwargs), self.timeout_s)
        except asyncio.TimeoutError:
            return ToolOutcome(call.name, f"error: {call.name} did not answer within {self.timeout_s:g} s",
                               "timeout", time.perf_counter() - start)
        except Exception as e:  # the tool's own failure: reported to the model and counted
            return ToolOutcome(call.name, f"error: {call.name} raised {type(e).__name__}: {e}"[:1000], "error",
                               time.perf_counter() - start)
        latency = time.perf_counter() - start
        if isinstance(result, str):
            result = ToolResult(result)
        if not isinstance(result, ToolResult) or not isinstance(result.text, str):
            return ToolOutcome(call.name, f"error: {call.name} returned {type(result).__name__}, not text", "error",
                               latency)
        text, cut = truncate_text(result.text, self.max_response_chars, self.truncate_side)
        return ToolOutcome(call.name, text, "error" if result.error else "ok", latency, cut)

    async def _execute(self, tool: BaseTool, arguments: dict, tools_kwargs: dict):
        accepted = tool.context_parameters()
        if accepted is not None:
            tools_kwargs = {k: v for k, v in tools_kwargs.items() if k in accepted}
        if tool.is_async:
            return await tool.execute(arguments, **tools_kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, lambda: tool.execute(arguments, **tools_kwargs))
