"""Interactions (simulated users): after a model turn without tool calls, the sample's interaction reads the
conversation and answers as the user, or ends the conversation (multi_turn.interaction_config_path).

The interface is veRL's (verl.interactions.base.BaseInteraction): async `start_interaction`, `generate_response`
returning (should_terminate, text, turn score, extra), `calculate_score`, `finalize_interaction`, one instance
serving every sample of a worker through instance ids; a class written for veRL runs here once it imports this
module's BaseInteraction. Each sample's data row names its interaction in `extra_info.interaction_kwargs.name`;
the whole interaction_kwargs mapping goes to start_interaction and generate_response, as veRL passes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from uuid import uuid4

KWARGS_KEY = "interaction_kwargs"


class BaseInteraction:
    """Subclass and implement `generate_response` (and keep per-sample state keyed by instance id)."""

    def __init__(self, config: dict[str, Any]):
        self.config = dict(config or {})
        self.name: str = self.config.get("name", "interaction_agent")

    async def start_interaction(self, instance_id: str | None = None, **kwargs) -> str:
        return instance_id if instance_id is not None else uuid4().hex

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs) -> tuple[bool, str, float | None, dict[str, Any]]:
        """(should_terminate, the user's message, this turn's score or None, extra data)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement generate_response")

    async def calculate_score(self, instance_id: str, **kwargs) -> float:
        return 0.0

    async def finalize_interaction(self, instance_id: str, **kwargs) -> None:
        return None


@dataclass
class UserReply:
    text: str
    terminate: bool
    score: float | None


class InteractionSession:
    """One sample's conversation with its interaction: started before the first model turn, finalized when the
    sample ends (veRL's tool agent loop never finalizes; its demo interactions only free their state there)."""

    def __init__(self, interaction: BaseInteraction, kwargs: dict[str, Any]):
        self.interaction = interaction
        self.kwargs = dict(kwargs)
        self.instance_id = uuid4().hex
        self.started = False

    async def start(self) -> None:
        self.instance_id = await self.interaction.start_interaction(self.instance_id, **self.kwargs)
        self.started = True

    async def reply(self, messages: list[dict]) -> UserReply:
        answer = await self.interaction.generate_response(self.instance_id, messages, **self.kwargs)
        if not (isinstance(answer, tuple) and len(answer) == 4 and isinstance(answer[1], str)):
            raise TypeError(f"interaction {self.interaction.name!r} ({type(self.interaction).__name__}) returned "
                            f"{answer!r:.120} from generate_response; expected (should_terminate: bool, message: "
                            "str, score: float | None, extra: dict)")
        terminate, text, score, _ = answer
        return UserReply(text, bool(terminate), None if score is None else float(score))

    async def finish(self) -> None:
        if self.started:
            self.started = False
            await self.interaction.finalize_interaction(self.instance_id)


def interaction_kwargs(extra_info: Any) -> dict | None:
    """The row's extra_info.interaction_kwargs (None when it has none)."""
    kwargs = extra_info.get(KWARGS_KEY) if isinstance(extra_info, dict) else None
    return dict(kwargs) if isinstance(kwargs, dict) else None


def row_interaction_problem(extra_info: Any, names: list[str]) -> str | None:
    """Why a row cannot be given one of the interactions `names` (None when it can)."""
    kwargs = interaction_kwargs(extra_info)
    if kwargs is None:
        return (f"extra_info has no {KWARGS_KEY} mapping; each row names its interaction there "
                f"({{name: one of {names}, ...}}, as veRL's gsm8k_multiturn_w_interaction preprocessing writes it)")
    name = kwargs.get("name")
    if name not in names:
        return f"extra_info.{KWARGS_KEY}.name={name!r} is none of the interaction file's names {names}"
    return None
