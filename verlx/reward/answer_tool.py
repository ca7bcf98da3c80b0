"""The base of veRL's demo answer-checking tools (Gsm8kTool, Geo3kTool): the model submits an answer and reads
`Current parsed answer='...' reward=R`, scored against the sample's
extra_info.tools_kwargs.<tool name>.create_kwargs.ground_truth (where veRL's data preprocessing puts it).

verlx's tools keep no state between calls, so veRL's per-call tool reward (-0.05 for an answer that does not improve
on the previous one) is not computed: veRL's examples train on the reward function's score, not on tool rewards, and
the text the model reads is the same."""

from __future__ import annotations

from typing import Any

from verlx.rollout.agent.tools import BaseTool, ToolResult, check_verl_tool_config


class AnswerTool(BaseTool):
    """Subclasses give `default_schema` and `score(answer, ground_truth)`."""

    default_schema: dict

    def __init__(self, config: dict | None = None, schema: dict | None = None):
        super().__init__(config, schema or self.default_schema)
        check_verl_tool_config(self.name, self.config, set())

    def context_parameters(self) -> set[str]:
        return {"create_kwargs"}

    def score(self, answer: str, ground_truth: Any) -> float:
        raise NotImplementedError

    def execute(self, arguments: dict, create_kwargs: dict | None = None) -> ToolResult:
        ground_truth = (create_kwargs or {}).get("ground_truth")
        if ground_truth is None:
            return ToolResult(f"error: {self.name} needs the sample's ground truth in extra_info.tools_kwargs."
                              f"{self.name}.create_kwargs.ground_truth", error=True)
        answer = str(arguments.get("answer", ""))
        reward = self.score(answer, ground_truth)
        return ToolResult(f"Current parsed {answer=} {reward=}")
