"""Typed configs under reward_model: the model-based reward model's own keys (veRL's names) and DAPO's
reward_kwargs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from verlx.config.engine import RefFSDPConfig

# reward_model.strategy: the training engines the reward model can be sharded with
REWARD_MODEL_STRATEGIES = ("fsdp", "fsdp2")


@dataclass
class OverlongBufferConfig:
    enable: bool = False
    len: int = 0
    penalty_factor: float = 1.0
    log: bool = False


@dataclass
class RewardKwargsConfig:
    """veRL's reward_model.reward_kwargs (passed to its reward manager): DAPO's overlong shaping."""

    overlong_buffer_cfg: OverlongBufferConfig = field(default_factory=OverlongBufferConfig)
    max_resp_len: int | None = None


@dataclass
class RewardModelModelConfig:
    input_tokenizer: str | None = None
    path: str | None = None
    external_lib: str | None = None
    trust_remote_code: bool = False
    override_config: dict[str, Any] = field(default_factory=dict)
    use_remove_padding: bool = False
    use_shm: bool = False
    fsdp_config: RefFSDPConfig = field(default_factory=RefFSDPConfig)
