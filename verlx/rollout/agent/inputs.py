"""What the driver hands the agent loop: the non-tensor columns generation reads."""

from __future__ import annotations

#: non-tensor columns the agent loop reads (those present are passed to generate_sequences)
AGENT_INPUT_KEYS = ("raw_prompt", "agent_name", "extra_info")


def agent_input_keys(batch, uses_agent_loop: bool) -> list[str]:
    if not uses_agent_loop:
        return []
    return [k for k in AGENT_INPUT_KEYS if k in batch.non_tensor_batch]
