"""Does the engine's share of the GPU hold its weights and one sequence? Checked before the engine allocates.

SGLang (mem_fraction_static) and vLLM (gpu_memory_utilization) both take a fraction of the GPU's total memory for
weights plus KV cache. A fraction too small for the weights alone fails late and cryptically inside the engine
(after minutes of start-up, or as "no KV cache blocks"); the numbers are known before: the parameters from the
checkpoint's headers, the KV bytes of one token from the model config.
"""

from __future__ import annotations

from dataclasses import dataclass

KEY = "actor_rollout_ref.rollout.gpu_memory_utilization"


@dataclass(frozen=True)
class EngineFootprint:
    weight_bytes: int
    kv_bytes_per_token: int
    max_model_len: int

    @property
    def one_sequence_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes_per_token * self.max_model_len


def kv_bytes_per_token(hf_config, dtype_bytes: int, tp_size: int = 1) -> int:
    """Keys and values of every layer for one token on one GPU of a tensor-parallel group (KV heads are split over
    the group, or replicated when there are fewer of them than GPUs)."""
    heads = hf_config.num_attention_heads
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    return 2 * hf_config.num_hidden_layers * max(1, kv_heads // tp_size) * head_dim * dtype_bytes


def engine_footprint(hf_config, numel: int, dtype_bytes: int, tp_size: int, max_model_len: int) -> EngineFootprint:
    """One GPU's share of the weights and the KV bytes per token of the language model (a vision-language config
    keeps its decoder's shape in its text config)."""
    kv = kv_bytes_per_token(hf_config.get_text_config(), dtype_bytes, tp_size)
    return EngineFootprint(numel * dtype_bytes // tp_size, kv, max_model_len)


def check_budget(engine: str, fraction: float, total_bytes: int, footprint: EngineFootprint) -> None:
    """Raise when fraction × total memory cannot hold the weights plus the KV cache of one max-length sequence."""
    budget = fraction * total_bytes
    needed = footprint.one_sequence_bytes
    if budget >= needed:
        return
    gib = 2**30
    raise ValueError(
        f"{KEY}={fraction} gives the {engine} engine {budget / gib:.2f} GiB of the GPU's {total_bytes / gib:.1f} GiB, "
        f"less than its weights ({footprint.weight_bytes / gib:.2f} GiB) plus the KV cache of one sequence of "
        f"{footprint.max_model_len} tokens ({footprint.kv_bytes_per_token * footprint.max_model_len / gib:.2f} GiB) "
        f"= {needed / gib:.2f} GiB; raise {KEY} to at least {needed / total_bytes:.2f} (more for a useful KV cache), "
        "or lower rollout.max_model_len / prompt_length + response_length"
    )
