"""HF ⇄ megatron weights: fused layouts, tensor-parallel slicing/merging and pipeline placement.

One `ParamSpec` per megatron parameter says which HF tensors make it and how it is split over TP ranks; both
directions and the rollout export plan are derived from that list, so they cannot disagree. Everything here is
a pure tensor function (exact, no arithmetic on values): a round trip returns bitwise-identical tensors.

Megatron layouts (names of the local layer spec; `te_name` gives transformer-engine's):
- linear_qkv: per query group g, the group's query heads, then k_g, then v_g, stacked along dim 0; TP ranks get
  whole groups, so the fused tensor is split along dim 0 as is.
- linear_fc1: [gate; up]; TP rank r holds [gate_r; up_r] (each half split separately).
- word embeddings / output layer: vocabulary rows split over TP, padded to a multiple of TP with zero rows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from verlx.workers.megatron.architectures import ModelDims
from verlx.workers.megatron.parallel import ParallelLayout

# How a merged (TP=1) megatron tensor is split over TP ranks.
REPLICATED, COLUMN, ROW, VOCAB, GLU = "replicated", "column", "row", "vocab", "glu"
# How HF tensors are combined into one megatron tensor.
SINGLE, QKV, GATE_UP = "single", "qkv", "gate_up"

_TE_NAMES = {
    "input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
    "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
}


@dataclass(frozen=True)
class ParamSpec:
    name: str  # megatron name with the GLOBAL layer index, e.g. decoder.layers.7.mlp.linear_fc1.weight
    hf_names: tuple[str, ...]
    combine: str  # SINGLE | QKV | GATE_UP
    tp_split: str  # REPLICATED | COLUMN | ROW | VOCAB | GLU
    layer: int | None = None  # global layer index; None for embedding, final norm, output layer
    expert: int | None = None  # global expert index of an expert's weight (mixture-of-experts layers)

    def local_name(self, local_layer: int | None, local_expert: int | None = None) -> str:
        if self.layer is None:
            return self.name
        name = self.name.replace(f"decoder.layers.{self.layer}.", f"decoder.layers.{local_layer}.", 1)
        if self.expert is not None:
            name = name.replace(f"local_experts.{self.expert}.", f"local_experts.{local_expert}.", 1)
        return name


def _layer_specs(dims: ModelDims, i: int) -> list[ParamSpec]:
    hf = f"model.layers.{i}."
    mc = f"decoder.layers.{i}."
    attn = [hf + f"self_attn.{p}_proj" for p in "qkv"]
    specs = [
        ParamSpec(mc + "input_layernorm.weight", (hf + "input_layernorm.weight",), SINGLE, REPLICATED, i),
        ParamSpec(mc + "self_attention.linear_qkv.weight", tuple(a + ".weight" for a in attn), QKV, COLUMN, i),
    ]
    if dims.qkv_bias:
        specs.append(ParamSpec(mc + "self_attention.linear_qkv.bias", tuple(a + ".bias" for a in attn), QKV, COLUMN, i))
    if dims.qk_norm:
        specs += [
            ParamSpec(mc + "self_attention.q_layernorm.weight", (hf + "self_attn.q_norm.weight",), SINGLE,
                      REPLICATED, i),
            ParamSpec(mc + "self_attention.k_layernorm.weight", (hf + "self_attn.k_norm.weight",), SINGLE,
                      REPLICATED, i),
        ]
    specs += [
        ParamSpec(mc + "self_attention.linear_proj.weight", (hf + "self_attn.o_proj.weight",), SINGLE, ROW, i),
        ParamSpec(mc + "pre_mlp_layernorm.weight", (hf + "post_attention_layernorm.weight",), SINGLE, REPLICATED, i),
    ]
    return specs + (_expert_specs(dims, i) if dims.is_moe else [
        ParamSpec(mc + "mlp.linear_fc1.weight", (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"), GATE_UP,
                  GLU, i),
        ParamSpec(mc + "mlp.linear_fc2.weight", (hf + "mlp.down_proj.weight",), SINGLE, ROW, i),
    ])


def _expert_specs(dims: ModelDims, i: int) -> list[ParamSpec]:
    """A mixture-of-experts layer: the router (replicated) and each expert's MLP (split over expert-TP ranks), in
    HF's checkpoint names (one tensor per expert and projection)."""
    hf, mc = f"model.layers.{i}.mlp.", f"decoder.layers.{i}.mlp."
    specs = [ParamSpec(mc + "router.weight", (hf + "gate.weight",), SINGLE, REPLICATED, i)]
    for e in range(dims.num_experts):
        src, dst = f"{hf}experts.{e}.", f"{mc}experts.local_experts.{e}."
        specs += [
            ParamSpec(dst + "linear_fc1.weight", (src + "gate_proj.weight", src + "up_proj.weight"), GATE_UP, GLU, i,
                      e),
            ParamSpec(dst + "linear_fc2.weight", (src + "down_proj.weight",), SINGLE, ROW, i, e),
        ]
    return specs


def param_specs(dims: ModelDims, pp: int = 1) -> list[ParamSpec]:
    """Every megatron parameter in model order. With tied embeddings and PP > 1 the last stage holds its own copy
    of the embedding as output_layer.weight (megatron keeps the two in sync); with PP = 1 there is none."""
    specs = [ParamSpec("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), SINGLE, VOCAB)]
    for i in range(dims.num_layers):
        specs += _layer_specs(dims, i)
    specs.append(ParamSpec("decoder.final_layernorm.weight", ("model.norm.weight",), SINGLE, REPLICATED))
    if not dims.tie_word_embeddings:
        specs.append(ParamSpec("output_layer.weight", ("lm_head.weight",), SINGLE, VOCAB))
    elif pp > 1:
        specs.append(ParamSpec("output_layer.weight", ("model.embed_tokens.weight",), SINGLE, VOCAB))
    return specs


def is_tied_copy(spec: ParamSpec, dims: ModelDims) -> bool:
    """The last stage's copy of tied embeddings: loaded from HF, never exported (the embedding is)."""
    return dims.tie_word_embeddings and spec.name == "output_layer.weight"


def te_name(local_name: str) -> str:
    """The transformer-engine layer spec's name for a local-spec name (layernorms fused into the next linear)."""
    for local, te in _TE_NAMES.items():
        if local_name.endswith(local):
            return local_name[: -len(local)] + te
    return local_name


def local_spec_name(name: str) -> str:
    """Inverse of te_name."""
    for local, te in _TE_NAMES.items():
        if name.endswith(te):
            return name[: -len(te)] + local
    return name


# ---------------------------------------------------------------------- pipeline placement
@dataclass(frozen=True)
class Placement:
    pp_rank: int
    chunk: int  # virtual pipeline chunk on that stage
    local_layer: int | None
    ep_rank: int = 0  # expert weights: the expert-parallel rank that holds the expert
    local_expert: int | None = None


def layer_placement(layer: int, num_layers: int, layout: ParallelLayout) -> Placement:
    """Megatron's assignment: consecutive blocks of the stages' layer counts (ParallelLayout.stage_layers) without
    virtual stages; interleaved with them, block b = chunk·pp + pp_rank holds layers [b·n, (b+1)·n)."""
    if layout.vpp is None:
        start = 0
        for pp_rank, count in enumerate(layout.stage_layers(num_layers)):
            if layer < start + count:
                return Placement(pp_rank, 0, layer - start)
            start += count
        raise IndexError(f"layer {layer} is beyond the model's {num_layers} layers")
    per_chunk = num_layers // (layout.pp * layout.chunks)
    block = layer // per_chunk
    return Placement(block % layout.pp, block // layout.pp, layer % per_chunk)


def placement(spec: ParamSpec, dims: ModelDims, layout: ParallelLayout) -> Placement:
    if spec.expert is not None:  # megatron gives each expert-parallel rank a contiguous block of experts
        per_rank = dims.num_experts // layout.ep
        where = layer_placement(spec.layer, dims.num_layers, layout)
        return Placement(where.pp_rank, where.chunk, where.local_layer, spec.expert // per_rank, spec.expert % per_rank)
    if spec.layer is not None:
        return layer_placement(spec.layer, dims.num_layers, layout)
    if spec.name.startswith("embedding."):
        return Placement(0, 0, None)
    return Placement(layout.pp - 1, layout.chunks - 1, None)


# ---------------------------------------------------------------------- combine / split
def fuse_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dims: ModelDims) -> torch.Tensor:
    g, d = dims.num_kv_heads, dims.head_dim
    rest = q.shape[1:]
    parts = [q.reshape(g, dims.heads_per_group * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)]
    return torch.cat(parts, dim=1).reshape(g * (dims.heads_per_group + 2) * d, *rest)


def split_qkv(fused: torch.Tensor, dims: ModelDims) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, hpg = dims.num_kv_heads, dims.head_dim, dims.heads_per_group
    rest = fused.shape[1:]
    grouped = fused.reshape(g, (hpg + 2) * d, *rest)
    q, k, v = torch.split(grouped, [hpg * d, d, d], dim=1)
    return q.reshape(g * hpg * d, *rest), k.reshape(g * d, *rest), v.reshape(g * d, *rest)


def combine_hf(spec: ParamSpec, tensors: list[torch.Tensor], dims: ModelDims, tp: int = 1) -> torch.Tensor:
    """The merged megatron tensor from its HF tensors (vocabulary rows padded for `tp`)."""
    if spec.combine == QKV:
        return fuse_qkv(*tensors, dims)
    if spec.combine == GATE_UP:
        return torch.cat(tensors, dim=0)
    (tensor,) = tensors
    if spec.tp_split == VOCAB:
        pad = dims.padded_vocab_size(tp) - tensor.shape[0]
        if pad:
            tensor = torch.cat([tensor, tensor.new_zeros(pad, *tensor.shape[1:])])
    return tensor


def split_to_hf(spec: ParamSpec, merged: torch.Tensor, dims: ModelDims) -> list[tuple[str, torch.Tensor]]:
    """The HF tensors of a merged megatron tensor (vocabulary padding dropped)."""
    if spec.combine == QKV:
        return list(zip(spec.hf_names, split_qkv(merged, dims)))
    if spec.combine == GATE_UP:
        return list(zip(spec.hf_names, torch.chunk(merged, 2, dim=0)))
    if spec.tp_split == VOCAB:
        merged = merged[: dims.vocab_size]
    return [(spec.hf_names[0], merged)]


def merged_shape(spec: ParamSpec, dims: ModelDims, tp: int) -> tuple[int, ...]:
    """Shape of the merged megatron tensor, without materialising it."""
    h, d = dims.hidden_size, dims.head_dim
    qkv_rows = dims.num_kv_heads * (dims.heads_per_group + 2) * d
    tail = spec.name.rsplit(".", 2)[-2:]
    module, kind = tail
    if spec.tp_split == VOCAB:
        return (dims.padded_vocab_size(tp), h)
    if module == "linear_qkv":
        return (qkv_rows, h) if kind == "weight" else (qkv_rows,)
    if module == "linear_proj":
        return (h, dims.num_heads * d)
    ffn = dims.moe_ffn_hidden_size if spec.expert is not None else dims.ffn_hidden_size
    if module == "linear_fc1":
        return (2 * ffn, h)
    if module == "linear_fc2":
        return (h, ffn)
    if module == "router":
        return (dims.num_experts, h)
    if module in ("q_layernorm", "k_layernorm"):
        return (d,)
    return (h,)


# ---------------------------------------------------------------------- tensor parallel
def tp_shard(tp_split: str, merged: torch.Tensor, tp: int, rank: int) -> torch.Tensor:
    """Rank `rank`'s slice of a merged tensor (a view where possible)."""
    if tp_split == REPLICATED or tp == 1:
        return merged
    if tp_split in (COLUMN, VOCAB):
        return torch.chunk(merged, tp, dim=0)[rank]
    if tp_split == ROW:
        return torch.chunk(merged, tp, dim=1)[rank]
    if tp_split == GLU:
        gate, up = torch.chunk(merged, 2, dim=0)
        return torch.cat([torch.chunk(gate, tp, dim=0)[rank], torch.chunk(up, tp, dim=0)[rank]])
    raise ValueError(f"unknown TP split {tp_split!r}")


def tp_merge(tp_split: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """Inverse of tp_shard over all ranks' shards, in rank order."""
    if tp_split == REPLICATED or len(shards) == 1:
        return shards[0]
    if tp_split in (COLUMN, VOCAB):
        return torch.cat(shards, dim=0)
    if tp_split == ROW:
        return torch.cat(shards, dim=1)
    if tp_split == GLU:
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves])
    raise ValueError(f"unknown TP split {tp_split!r}")


# ---------------------------------------------------------------------- whole-model conversion
def hf_to_megatron(hf_state: Mapping[str, torch.Tensor], dims: ModelDims, layout: ParallelLayout, tp_rank: int,
                   pp_rank: int, ep_rank: int = 0) -> list[dict[str, torch.Tensor]]:
    """This (tp_rank, pp_rank, ep_rank)'s parameters, one dict of local-spec names per virtual pipeline chunk
    (expert weights split over expert-TP ranks, here tp_rank modulo the expert-TP size)."""
    chunks: list[dict[str, torch.Tensor]] = [{} for _ in range(layout.chunks)]
    for spec in param_specs(dims, layout.pp):
        where = placement(spec, dims, layout)
        if where.pp_rank != pp_rank or (spec.expert is not None and where.ep_rank != ep_rank):
            continue
        missing = [n for n in spec.hf_names if n not in hf_state]
        if missing:
            raise KeyError(f"{dims.architecture} checkpoint lacks {missing} (needed for megatron {spec.name})")
        merged = combine_hf(spec, [hf_state[n] for n in spec.hf_names], dims, layout.tp)
        tp = layout.expert_tp if spec.expert is not None else layout.tp
        chunks[where.chunk][spec.local_name(where.local_layer, where.local_expert)] = tp_shard(
            spec.tp_split, merged, tp, tp_rank % tp)
    return chunks


def megatron_to_hf(shards: Mapping[tuple[int, int, int], list[dict[str, torch.Tensor]]], dims: ModelDims,
                   layout: ParallelLayout) -> dict[str, torch.Tensor]:
    """The HF state dict from every rank's chunks: `shards[(tp_rank, pp_rank, ep_rank)]` as hf_to_megatron returns
    them."""
    out: dict[str, torch.Tensor] = {}
    for spec in param_specs(dims, layout.pp):
        if is_tied_copy(spec, dims):
            continue
        where = placement(spec, dims, layout)
        local = spec.local_name(where.local_layer, where.local_expert)
        tp = layout.expert_tp if spec.expert is not None else layout.tp
        parts = [shards[(r, where.pp_rank, where.ep_rank)][where.chunk][local] for r in range(tp)]
        out.update(split_to_hf(spec, tp_merge(spec.tp_split, parts), dims))
    return out
