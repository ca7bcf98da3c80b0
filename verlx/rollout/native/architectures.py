"""Which HF checkpoints the native engine runs, and the shape facts it reads from their config.

Each supported architecture registers the features that set it apart (biases, q/k norm, how sliding-window
layers are chosen); everything else is the shared Llama-style decoder: RMSNorm, RoPE, GQA, SwiGLU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from verlx.utils.registry import Registry

UNSUPPORTED_HINT = "Use actor_rollout_ref.rollout.name=hf (transformers generate) for this model."


@dataclass(frozen=True)
class ArchitectureFeatures:
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    # "all": every layer uses config.sliding_window; "qwen": layers >= max_window_layers when use_sliding_window
    sliding_rule: str = "none"


ARCHITECTURES: Registry[Callable[[Any], ArchitectureFeatures]] = Registry(
    "native-engine architecture", "architectures in the model's config.json"
)
_MODEL_TYPES: dict[str, str] = {}


def register_architecture(name: str, model_type: str):
    def decorator(fn: Callable[[Any], ArchitectureFeatures]):
        ARCHITECTURES.register(name)(fn)
        _MODEL_TYPES[model_type] = name
        return fn

    return decorator


@register_architecture("Qwen2ForCausalLM", "qwen2")
def _qwen2(cfg) -> ArchitectureFeatures:
    return ArchitectureFeatures(qkv_bias=True, sliding_rule="qwen")


@register_architecture("Qwen3ForCausalLM", "qwen3")
def _qwen3(cfg) -> ArchitectureFeatures:
    bias = bool(getattr(cfg, "attention_bias", False))
    return ArchitectureFeatures(qkv_bias=bias, o_bias=bias, qk_norm=True, sliding_rule="qwen")


@register_architecture("LlamaForCausalLM", "llama")
def _llama(cfg) -> ArchitectureFeatures:
    bias = bool(getattr(cfg, "attention_bias", False))
    return ArchitectureFeatures(qkv_bias=bias, o_bias=bias, mlp_bias=bool(getattr(cfg, "mlp_bias", False)))


@register_architecture("MistralForCausalLM", "mistral")
def _mistral(cfg) -> ArchitectureFeatures:
    return ArchitectureFeatures(sliding_rule="all")


@dataclass(frozen=True)
class ModelSpec:
    """Everything the engine needs to know about a checkpoint's shapes."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    tie_word_embeddings: bool
    features: ArchitectureFeatures
    sliding_windows: tuple[int | None, ...]  # per layer; None = full attention
    max_position_embeddings: int
    initializer_range: float

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def qkv_rows(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim


def architecture_name(hf_config) -> str:
    archs = list(getattr(hf_config, "architectures", None) or [])
    if archs:
        return archs[0]
    model_type = getattr(hf_config, "model_type", "")
    return _MODEL_TYPES.get(model_type, f"<model_type {model_type!r}>")


def model_spec(hf_config) -> ModelSpec:
    """Read an HF config into a ModelSpec; unsupported models get an error naming what would work."""
    name = architecture_name(hf_config)
    if name not in ARCHITECTURES:
        raise ValueError(
            f"the native rollout engine does not support architecture {name} (model_type "
            f"{getattr(hf_config, 'model_type', None)!r}); it runs {', '.join(ARCHITECTURES.names())}. "
            + UNSUPPORTED_HINT
        )
    features = ARCHITECTURES.get(name)(hf_config)
    act = getattr(hf_config, "hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"{name} with hidden_act={act!r} is not supported (only silu/SwiGLU). " + UNSUPPORTED_HINT)
    heads = hf_config.num_attention_heads
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if heads % kv_heads:
        raise ValueError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
    head_dim = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // heads
    layers = hf_config.num_hidden_layers
    return ModelSpec(
        architecture=name,
        vocab_size=hf_config.vocab_size,
        hidden_size=hf_config.hidden_size,
        intermediate_size=hf_config.intermediate_size,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(getattr(hf_config, "rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
        features=features,
        sliding_windows=_sliding_windows(hf_config, features.sliding_rule, layers),
        max_position_embeddings=int(getattr(hf_config, "max_position_embeddings", 2048)),
        initializer_range=float(getattr(hf_config, "initializer_range", 0.02)),
    )


def _sliding_windows(cfg, rule: str, layers: int) -> tuple[int | None, ...]:
    window = getattr(cfg, "sliding_window", None)
    layer_types = getattr(cfg, "layer_types", None)
    if window is None or rule == "none":
        return (None,) * layers
    if layer_types:  # transformers >= 4.53 spells the choice out per layer
        return tuple(window if t == "sliding_attention" else None for t in layer_types)
    if rule == "qwen":
        if not getattr(cfg, "use_sliding_window", False):
            return (None,) * layers
        first = getattr(cfg, "max_window_layers", layers)
        return tuple(window if i >= first else None for i in range(layers))
    return (window,) * layers
