"""verlx: a trustworthy, fast RL trainer for large language models (PPO / GRPO) in the style of veRL."""

__version__ = "0.1.0"

__all__ = ["DataProto", "__version__"]


def __getattr__(name: str):
    """DataProto is imported on first use, so light subprocesses (reward scoring workers) can import
    verlx.* modules without paying for torch."""
    if name == "DataProto":
        from verlx.protocol import DataProto

        return DataProto
    raise AttributeError(f"module 'verlx' has no attribute '{name}'")
