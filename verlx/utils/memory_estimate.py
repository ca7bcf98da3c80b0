"""Bytes one GPU needs to train or run a decoder model, from the model's shape: the arithmetic behind the automatic
token budget and the gradient-checkpointing decision (verlx.workers.memory_plan), kept apart so that every term can
be checked by hand.

The model is an HF decoder of the Qwen2 / Llama family: per layer an RMSNorm, q/k/v/o projections (grouped-query
attention), an RMSNorm and a SwiGLU MLP; around the layers the embeddings, a final norm and the output projection
(the root FSDP unit). Training runs in bf16 compute (2 bytes per activation) with master weights of
`fsdp_config.model_dtype`.

Activations a layer keeps for backward, per token (bytes; q = heads × head_dim, kv = kv_heads × head_dim,
h = hidden size, I = intermediate size):

  eager     2 RMSNorms × (fp32 input 4h + bf16 normalised 2h + fp32 rstd 4)  = 12h + 8
            the inputs of q/k/v and of gate/up (bf16)                          = 4h
            the attention kernel's q, k, v and output (bf16), fp32 log-sum-exp = 2(q + 2kv) + 2q + 4·heads
            SwiGLU: gate, silu(gate), up, and the product that enters down     = 8I
  compiled  inductor keeps bf16 tensors instead of the fp32 copies: each RMSNorm its input, output and rstd
            (2 × (2h + 2h + 4)); the MLP gate, up and their product, recomputing only silu (6I); attention is
            opaque to the compiler and keeps the same.
  checkpointed  only the layer's bf16 input (2h) stays; in backward one layer is recomputed at a time.

Backward needs, on top of what is kept, one layer's worth again (eager) for the gradients flowing through it; the
head keeps the final norm's tensors, the bf16 hidden states the log-prob chunks read, and 20 bytes of per-token
results. The log-probs never build the full [tokens, vocab] logits: one chunk of `logprob_chunk_size` tokens at a
time (verlx.models.chunked_logprob), whose working set is 12 bytes per logit eager (bf16 product, fp32 copy, fp32
probabilities, bf16 gradient) or 4 compiled (bf16 product and bf16 gradient, the rest fused); a forward pass
without gradients needs 10 and 2.

These are estimates: allocator fragmentation, cuBLAS workspaces and kernel temporaries are left to the safety
margin of the caller. Against the peaks measured on 2026-11-22 (docs/benchmarks.md, one update of the 0.5B / 1.5B
shapes): 0.5B at 18,432 tokens, eager 36.75 GiB estimated vs 36.2 measured, compiled 27.4 vs 27.8; 1.5B at 9,216
tokens, eager 54.5 vs 53.5, compiled 44.9 vs 45.4.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 2**30
MIB = 2**20
DTYPE_BYTES = {"fp32": 4, "float32": 4, "bf16": 2, "bfloat16": 2, "fp16": 2, "float16": 2}
COMPUTE_BYTES = 2  # bf16 activations
QKV_BIAS_MODEL_TYPES = ("qwen2",)  # Qwen2 has biases on q, k, v (not o) without saying so in its config


def dtype_bytes(name: str) -> int:
    """Bytes per element of a config dtype name (fsdp_config.model_dtype, ...)."""
    if name not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(DTYPE_BYTES)}")
    return DTYPE_BYTES[name]


@dataclass(frozen=True)
class ModelShape:
    """What the estimate needs of a decoder; `parameters` counts every parameter (checkpoint headers when known)."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    layer_parameters: int
    root_parameters: int  # embeddings (+ lm_head when untied) + final norm
    parameters: int

    @classmethod
    def from_hf_config(cls, cfg, parameters: int | None = None) -> ModelShape:
        h, heads = cfg.hidden_size, cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or h // heads
        q, kv = heads * head_dim, kv_heads * head_dim
        attention_bias = bool(getattr(cfg, "attention_bias", False))
        qkv_bias = attention_bias or getattr(cfg, "model_type", "") in QKV_BIAS_MODEL_TYPES
        layer = h * q + 2 * h * kv + q * h + 3 * h * cfg.intermediate_size + 2 * h
        layer += (q + 2 * kv) * qkv_bias + h * attention_bias
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        root = cfg.vocab_size * h * (1 if tied else 2) + h
        counted = cfg.num_hidden_layers * layer + root
        return cls(h, cfg.intermediate_size, cfg.num_hidden_layers, heads, kv_heads, head_dim, cfg.vocab_size,
                   layer, root, parameters if parameters is not None else counted)

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim


def layer_activation_bytes(shape: ModelShape, compiled: bool) -> int:
    """Bytes one decoder layer keeps for backward per token (see the module docstring)."""
    h, inter = shape.hidden, shape.intermediate
    attention = 2 * (shape.q_width + 2 * shape.kv_width) + 2 * shape.q_width + 4 * shape.heads
    if compiled:
        return 2 * (2 * h + 2 * h + 4) + attention + 6 * inter
    return 2 * (4 * h + 2 * h + 4) + 4 * h + attention + 8 * inter


def head_activation_bytes(shape: ModelShape, compiled: bool) -> int:
    """Per token after the layers: the final norm's tensors, the hidden states the log-prob chunks read, and the
    per-token results (target id, log-sum-exp, log-prob, entropy)."""
    final_norm = (2 * shape.hidden + 4) if compiled else (6 * shape.hidden + 4)
    return final_norm + 2 * shape.hidden + 20


def training_activation_bytes(shape: ModelShape, checkpointing: bool, compiled: bool) -> int:
    """Bytes per token of a micro-batch in forward + backward: what every layer keeps, plus one layer recomputed
    (checkpointing) and one layer's gradients in flight, plus the head."""
    per_layer = layer_activation_bytes(shape, compiled)
    kept = shape.layers * (2 * shape.hidden if checkpointing else per_layer)
    recomputed = per_layer if checkpointing else 0
    return kept + recomputed + layer_activation_bytes(shape, compiled=False) + head_activation_bytes(shape, compiled)


def forward_activation_bytes(shape: ModelShape, compiled: bool) -> int:
    """Bytes per token of a forward pass without gradients: one layer's tensors at a time, plus the head."""
    return layer_activation_bytes(shape, compiled=False) + head_activation_bytes(shape, compiled)


def logits_chunk_bytes(shape: ModelShape, chunk_tokens: int, compiled: bool, training: bool) -> int:
    """The log-prob chunk's working set: `chunk_tokens` × vocabulary logits at 12 / 4 bytes (training, eager /
    compiled) or 10 / 2 (forward only)."""
    per_logit = (4 if compiled else 12) if training else (2 if compiled else 10)
    return chunk_tokens * shape.vocab * per_logit


def fsdp_working_bytes(shape: ModelShape, training: bool) -> int:
    """Unsharded bf16 parameters FSDP gathers: the root (kept after forward) and two layers (the one computing and
    the one prefetched); training adds the unsharded bf16 gradient and its fp32 reduce-scatter copy of the root and
    of one layer."""
    gathered = 2 * shape.root_parameters + 2 * 2 * shape.layer_parameters
    gradients = (2 + 4) * (shape.root_parameters + shape.layer_parameters) if training else 0
    return gathered + gradients


@dataclass(frozen=True)
class ModelState:
    """One model's state on one GPU: its parameters sharded over `shards` ranks in `param_bytes`-byte master
    weights; a trainable model has gradients of the same dtype and AdamW's two moments."""

    name: str
    parameters: int
    param_bytes: int
    trainable: bool
    shards: int = 1

    @property
    def weights(self) -> int:
        return -(-self.parameters // self.shards) * self.param_bytes

    @property
    def gradients(self) -> int:
        return self.weights if self.trainable else 0

    @property
    def optimizer(self) -> int:
        return 2 * self.weights if self.trainable else 0

    @property
    def training_total(self) -> int:
        return self.weights + self.gradients + self.optimizer
