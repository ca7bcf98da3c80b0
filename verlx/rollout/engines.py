"""Importing this module registers every built-in rollout engine (each imports its own package lazily)."""

from verlx.rollout import hf_engine  # noqa: F401
from verlx.rollout import sglang_engine  # noqa: F401
from verlx.rollout import vllm_engine  # noqa: F401
from verlx.rollout.native import engine as native_engine  # noqa: F401
