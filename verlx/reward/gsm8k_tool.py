"""veRL's demo tool `calc_gsm8k_reward` (verl.tools.gsm8k_tool.Gsm8kTool), which its GSM8K multi-turn examples
declare: the model submits an answer and is told whether it is right, scored as veRL scores it (GSM8K's flexible
rule: the last number of "#### <answer>"). The ground truth comes from the sample's
extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth, as in veRL's data.

verlx's tools keep no state between calls, so veRL's -0.05 tool reward for an answer that does not improve on the
previous one is not computed: veRL's example trains on the reward function's score, not on tool rewards, and the text
the model reads is the same."""

from __future__ import annotations

from verlx.reward.scores.gsm8k import compute_score
from verlx.rollout.agent.tools import BaseTool, ToolResult


class Gsm8kTool(BaseTool):
    default_schema = {
        "type": "function",
        "function": {
            "name": "calc_gsm8k_reward",
            "description": "A tool for calculating the reward of gsm8k",
            "parameters": {"type": "object",
                           "properties": {"answer": {"type": "string", "description": "The answer to the question"}},
                           "required": ["answer"]},
        },
    }

    def __init__(self, config: dict | None = None, schema: dict | None = None):
        super().__init__(config, schema or self.default_schema)

    def context_parameters(self) -> set[str]:
        return {"create_kwargs"}

    def execute(self, arguments: dict, create_kwargs: dict | None = None) -> ToolResult:
        ground_truth = (create_kwargs or {}).get("ground_truth")
        if ground_truth is None:
            return ToolResult(f"error: {self.name} needs the sample's ground truth in extra_info.tools_kwargs."
                              f"{self.name}.create_kwargs.ground_truth", error=True)
        answer = str(arguments.get("answer", ""))
        submitted = answer if answer.startswith("#### ") else "#### " + answer
        reward = compute_score(submitted, ground_truth, method="flexible", format_score=0.0, score=1.0)
        return ToolResult(f"Current parsed {answer=} {reward=}")
