"""One sample's trajectory: prompt ids, then model and context (tool/user) segments, all as token ids.

response_mask is 1 on model tokens only; rollout log-probs exist for model tokens only (0 elsewhere). The
response budget (rollout.response_length) is shared by all turns: a model turn is generated with at most the
tokens left; a context segment that does not fit (with room for at least one more model token) is not appended,
so the trajectory ends at a turn boundary and `stop_reason` says why.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field


@dataclass
class Segment:
    ids: list[int]
    is_model: bool
    log_probs: list[float] | None = None


@dataclass
class Trajectory:
    prompt_ids: list[int]
    budget: int
    segments: list[Segment] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)  # the conversation, for tools, rewards and the check
    stop_reason: str = ""  # answered | length | max_assistant_turns | max_user_turns | context_over_budget | error
    # | cancelled (over_sample_rate) | interaction_ended (the interaction's last message ends the conversation)
    assistant_turns: int = 0
    user_turns: int = 0
    turn_scores: list[float] = field(default_factory=list)  # the interaction's score of each user turn (veRL's)
    tool_calls: int = 0
    tool_errors: int = 0
    tool_timeouts: int = 0
    tool_malformed: int = 0
    tool_truncated: int = 0
    tool_latency_s: list[float] = field(default_factory=list)
    template_mismatch: bool = False
    template_rewrite: bool = False
    mismatch_detail: str = ""

    @property
    def used(self) -> int:
        return sum(len(s.ids) for s in self.segments)

    @property
    def remaining(self) -> int:
        return self.budget - self.used

    @property
    def context_ids(self) -> list[int]:
        """Everything the model sees before its next turn."""
        return list(itertools.chain(self.prompt_ids, *(s.ids for s in self.segments)))

    def add_model(self, ids: list[int], log_probs: list[float] | None) -> None:
        if len(ids) > self.remaining:
            raise ValueError(f"model turn of {len(ids)} tokens exceeds the {self.remaining} tokens left")
        self.segments.append(Segment(list(ids), True, None if log_probs is None else list(log_probs)))
        self.assistant_turns += 1

    def fits(self, ids: list[int]) -> bool:
        """Whether a context segment fits and leaves room for at least one model token."""
        return len(ids) < self.remaining

    def add_context(self, ids: list[int]) -> None:
        if not self.fits(ids):
            raise ValueError(f"context segment of {len(ids)} tokens does not fit the {self.remaining} tokens left")
        self.segments.append(Segment(list(ids), False))

    def response(self) -> tuple[list[int], list[int], list[float]]:
        """(response ids, response mask, rollout log-probs), one entry per response token."""
        ids, mask, lps = [], [], []
        for s in self.segments:
            ids += s.ids
            mask += [int(s.is_model)] * len(s.ids)
            lps += s.log_probs if (s.is_model and s.log_probs is not None) else [0.0] * len(s.ids)
        return ids, mask, lps
