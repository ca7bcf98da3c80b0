"""veRL's demo interaction for GSM8K (verl.interactions.gsm8k_interaction.Gsm8kInteraction), which its multi-turn
examples declare: the user checks the model's last answer against the row's interaction_kwargs.ground_truth with
GSM8K's strict rule ("#### <answer>", 1.0 right, 0.0 otherwise); a right answer ends the conversation, a wrong one
asks the model to try again. The messages and scores are veRL's; the answer is compared as verlx's gsm8k reward
compares it (numerically: "#### 18.0" matches 18, where veRL's string comparison does not), so the user and the
reward function agree."""

from __future__ import annotations

from typing import Any

from verlx.reward.scores.gsm8k import compute_score
from verlx.rollout.agent.interactions import BaseInteraction

CORRECT = "Your response is correct!"
INCORRECT = "Your response is incorrect! You need to reflect on your answer and try again."


class Gsm8kInteraction(BaseInteraction):
    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        unknown = sorted(set(self.config) - {"name"})
        if unknown:
            raise ValueError(f"interaction {self.name}: Gsm8kInteraction reads no config keys, got {unknown}")
        self._state: dict[str, dict[str, Any]] = {}

    async def start_interaction(self, instance_id: str | None = None, ground_truth: Any = None, **kwargs) -> str:
        instance_id = await super().start_interaction(instance_id)
        self._state[instance_id] = {"response": "", "ground_truth": ground_truth}
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float, dict]:
        last = next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "assistant"), "")
        self._state[instance_id]["response"] = last
        reward = await self.calculate_score(instance_id)
        if reward == 1.0:
            return True, CORRECT, reward, {}
        return False, INCORRECT, reward, {}

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        state = self._state[instance_id]
        if state["ground_truth"] is None:
            return 0.0
        return float(compute_score(state["response"], state["ground_truth"], method="strict", format_score=0.0,
                                   score=1.0))

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        self._state.pop(instance_id, None)
