"""verlx: a trustworthy, fast RL trainer for large language models (PPO / GRPO) in the style of veRL."""

__version__ = "0.1.0"

from verlx.protocol import DataProto  # noqa: E402

__all__ = ["DataProto", "__version__"]
