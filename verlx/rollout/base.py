"""The rollout-engine interface, its registry and the batch layout every engine returns.

An engine lives inside a worker process next to the FSDP actor. Per step it is woken, given fresh weights,
asked to generate, and put back to sleep so training gets the memory. Every engine returns the same layout
(`build_rollout_batch`), so the trainer never knows which one ran.
"""

from __future__ import annotations

import abc
import functools
import importlib.util
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from verlx.protocol import DataProto
from verlx.utils.registry import Registry

logger = logging.getLogger(__name__)
ROLLOUT_ENGINES: Registry[type[RolloutEngine]] = Registry("rollout engine", "actor_rollout_ref.rollout.name",
                                                            import_paths=True)
# Built-in engines by name; each module is imported when its engine is first asked for (and imports its own
# package lazily in turn), so nothing here imports an engine.
for _name, _target in {
    "native": "verlx.rollout.native.engine:NativeEngine",
    "hf": "verlx.rollout.hf_engine:HFEngine",
    "sglang": "verlx.rollout.sglang_engine:SGLangRolloutEngine",
    "vllm": "verlx.rollout.vllm_engine:VLLMRolloutEngine",
}.items():
    ROLLOUT_ENGINES.register_lazy(_name, _target)
# `auto` tries these in order and takes the first whose package is installed.
AUTO_ENGINE_ORDER = ("sglang", "vllm", "native")


@dataclass
class RolloutContext:
    """Everything an engine needs to know about where it runs."""

    config: Any  # RolloutConfig
    model_path: str
    hf_config: Any
    device: torch.device
    pad_token_id: int
    eos_token_ids: list[int]
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    tp_size: int = 1
    trust_remote_code: bool = False
    tokenizer_path: str | None = None
    #: worker processes (GPUs) per node, trainer.n_gpus_per_node; None: every rank on one node
    n_gpus_per_node: int | None = None

    @property
    def gpus_per_node(self) -> int:
        return self.n_gpus_per_node or self.world_size

    @property
    def nnodes(self) -> int:
        return self.world_size // self.gpus_per_node

    @property
    def engine_dtype(self) -> torch.dtype:
        """rollout.dtype on GPU; float32 on CPU (weight_sync.engine_dtype_on)."""
        from verlx.rollout.weight_sync import engine_dtype_on

        return engine_dtype_on(self.config.dtype, self.device)

    @functools.cached_property
    def layout(self):
        """Tensor-parallel groups, GPUs and ports of this rank (verlx.rollout.engine_layout): the one place the
        rollout rank arithmetic is done."""
        from verlx.rollout.engine_layout import DEFAULT_BASE_PORT, plan_engine_layout

        base_port = int(os.environ.get("VERLX_ROLLOUT_BASE_PORT", DEFAULT_BASE_PORT))
        return plan_engine_layout(self.rank, self.world_size, self.tp_size, self.gpus_per_node, self.nnodes, base_port)

    @property
    def tp_rank(self) -> int:
        return self.layout.tp_rank

    @property
    def dp_rank(self) -> int:
        return self.layout.dp_rank

    @property
    def dp_size(self) -> int:
        return self.layout.dp_size


@dataclass
class SamplingParams:
    """Engine-neutral sampling settings for one generate call."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 512
    min_new_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] = field(default_factory=list)
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


def resolve_sampling(config, meta_info: dict, eos_token_ids: list[int]) -> SamplingParams:
    """Config + per-call meta_info → SamplingParams.

    meta_info keys: validate (use val_kwargs), do_sample (false = greedy), and explicit overrides
    temperature / top_p / top_k / n / max_new_tokens / min_new_tokens / ignore_eos / seed.
    """
    if meta_info.get("validate", False):
        v = config.val_kwargs
        base = dict(n=v.n, temperature=v.temperature if v.do_sample else 0.0, top_p=v.top_p, top_k=v.top_k)
    else:
        do_sample = meta_info.get("do_sample", config.do_sample)
        base = dict(n=1, temperature=config.temperature if do_sample else 0.0, top_p=config.top_p, top_k=config.top_k)
    for key in ("temperature", "top_p", "top_k", "n"):
        if key in meta_info:
            base[key] = meta_info[key]
    if not meta_info.get("do_sample", True):
        base["temperature"] = 0.0
    params = SamplingParams(
        **base,
        max_new_tokens=int(meta_info.get("max_new_tokens", config.response_length)),
        min_new_tokens=int(meta_info.get("min_new_tokens", 0)),
        ignore_eos=bool(meta_info.get("ignore_eos", config.ignore_eos)),
        stop_token_ids=list(eos_token_ids),
        seed=meta_info.get("seed"),
    )
    if params.n < 1:
        raise ValueError(f"rollout n must be >= 1, got {params.n} (actor_rollout_ref.rollout.n / val_kwargs.n)")
    if params.max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {params.max_new_tokens}")
    if params.greedy:
        params.top_p, params.top_k = 1.0, -1
    return params


class RolloutEngine(abc.ABC):
    """Generation inside a worker: generate / sleep / wake_up / update_weights."""

    #: the pip package whose presence makes the engine usable (None: always available)
    requires_package: str | None = None
    #: whether the engine can decode greedily (REMAX's baseline needs it)
    supports_greedy: bool = True

    def __init__(self, ctx: RolloutContext):
        self.ctx = ctx
        self.config = ctx.config

    @classmethod
    def is_available(cls) -> bool:
        return cls.requires_package is None or importlib.util.find_spec(cls.requires_package) is not None

    @classmethod
    def check_install(cls) -> None:
        """Raise if the installed package cannot be used (e.g. an unsupported release); runs before Ray starts."""

    @classmethod
    def install_command(cls) -> str:
        """What to tell a user who chose the engine without its package installed."""
        return f"pip install {cls.requires_package}" if cls.requires_package else ""

    @abc.abstractmethod
    def generate(self, prompts: DataProto) -> DataProto:
        """Left-padded prompts (input_ids, attention_mask, position_ids) → the rollout batch layout."""

    @abc.abstractmethod
    def sleep(self) -> None:
        """Release KV cache and weights (the training phase needs the memory)."""

    @abc.abstractmethod
    def wake_up(self, tags: Iterable[str] = ("weights", "kv_cache")) -> None:
        """Restore what sleep released; `weights` before a weight push, `kv_cache` after it."""

    @abc.abstractmethod
    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """One push of a weight version: copy the HF-named tensors of a (lazy) stream into the engine, bucket by
        bucket; raise if the engine rejects them. Engines that start from random weights or discard them while
        asleep count what arrived within this one call, so callers pass the whole stream at once, never one
        bucket per call."""


def resolve_engine_name(name: str) -> str:
    """`auto` → the first installed of AUTO_ENGINE_ORDER; `module:Class` → a user engine; any other name must be
    registered and installed."""
    if name == "auto":
        for candidate in AUTO_ENGINE_ORDER:
            engine = ROLLOUT_ENGINES.get(candidate)
            if engine.is_available():
                try:
                    engine.check_install()
                except Exception as e:  # an installed but unusable engine: try the next one
                    logger.warning("rollout.name=auto skips %s: %s", candidate, e)
                    continue
                return candidate
        return "hf"
    cls = ROLLOUT_ENGINES.get(name)
    if not (isinstance(cls, type) and issubclass(cls, RolloutEngine)):
        raise TypeError(f"actor_rollout_ref.rollout.name={name} is not a RolloutEngine subclass")
    if not cls.is_available():
        raise RuntimeError(
            f"actor_rollout_ref.rollout.name={name} needs the '{cls.requires_package}' package, which is not "
            f"installed. Install it with: {cls.install_command()}. Or choose rollout.name=native, which needs "
            "nothing beyond torch."
        )
    cls.check_install()
    return name


def get_engine_class(name: str) -> type[RolloutEngine]:
    return ROLLOUT_ENGINES.get(resolve_engine_name(name))


# ---------------------------------------------------------------------- the shared output layout
def build_rollout_batch(
    prompts: DataProto,
    responses: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_log_probs: torch.Tensor | None,
    n: int,
) -> DataProto:
    """The layout every engine returns, rows ordered [p0s0, p0s1, ..., p1s0, ...] (prompts repeated n times).

    responses: [B*n, R] padded on the right with the pad token; response_mask: 1 for generated tokens up to and
    including the stop token. input_ids/attention_mask/position_ids cover prompt + response.
    """
    source = prompts.repeat(n, interleave=True) if n > 1 else prompts
    prompt_ids = source.batch["input_ids"]
    prompt_mask = source.batch["attention_mask"]
    prompt_pos = source.batch["position_ids"]
    if responses.shape[0] != prompt_ids.shape[0]:
        raise ValueError(f"engine returned {responses.shape[0]} responses for {prompt_ids.shape[0]} prompt samples")
    response_mask = response_mask.to(prompt_mask.dtype)
    r = responses.shape[1]
    delta = torch.arange(1, r + 1, device=prompt_pos.device, dtype=prompt_pos.dtype)
    response_pos = prompt_pos[:, -1:] + delta
    batch = {
        "prompts": prompt_ids,
        "responses": responses.to(prompt_ids.dtype),
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids, responses.to(prompt_ids.dtype)], dim=-1),
        "attention_mask": torch.cat([prompt_mask, response_mask], dim=-1),
        "position_ids": torch.cat([prompt_pos, response_pos], dim=-1),
    }
    if rollout_log_probs is not None:
        batch["rollout_log_probs"] = rollout_log_probs.float() * response_mask
    non_tensor = {k: v for k, v in source.non_tensor_batch.items()}
    return DataProto(batch, non_tensor, dict(prompts.meta_info))


def mask_after_stop(tokens: torch.Tensor, stop_token_ids: list[int],
                    pad_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Given generated tokens [B, R], keep everything up to and including the first stop token.

    Returns (tokens with pad after the stop, response_mask), computed without a Python loop over tokens.
    """
    if stop_token_ids:
        is_stop = torch.isin(tokens, torch.tensor(stop_token_ids, device=tokens.device))
        # a position is valid if no stop token occurred strictly before it
        stops_before = torch.cumsum(is_stop.int(), dim=-1) - is_stop.int()
        mask = stops_before == 0
    else:
        mask = torch.ones_like(tokens, dtype=torch.bool)
    return torch.where(mask, tokens, torch.full_like(tokens, pad_token_id)), mask.long()
