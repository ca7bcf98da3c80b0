"""Building megatron-core GPT chunks from an HF checkpoint, and their RL heads (log-probs, values).

`RLModelChunk` wraps one GPTModel chunk (one virtual pipeline stage on this rank). We drive its embedding and
decoder ourselves instead of GPTModel.forward, so the last stage hands hidden states to the vocab-parallel
log-prob head (no [tokens, vocab] logits) or to a value head; RoPE tables come from the model's own inv_freq.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import torch
from megatron.core import parallel_state as mpu
from megatron.core import tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig

from verlx.models.vocab_parallel_logprob import vocab_parallel_log_probs, vocab_parallel_sum_pi_squared
from verlx.workers.megatron.architectures import ModelDims, gpt_model_kwargs, transformer_config_kwargs
from verlx.workers.megatron.batch_layout import AlignedBatch
from verlx.workers.megatron.overrides import transformer_kwargs_with_overrides
from verlx.workers.megatron.parallel import ParallelLayout
from verlx.workers.megatron.weight_layout import (
    REPLICATED,
    ROW,
    combine_hf,
    local_spec_name,
    param_specs,
    placement,
    te_name,
    tp_shard,
)


def layer_spec(dims: ModelDims, use_te: bool, local_layers: int):
    """The block spec: transformer-engine's layers, or megatron's local layers with our SDPA attention and RMSNorm."""
    if use_te:
        if dims.is_moe:
            raise ValueError("mixture-of-experts models are converted for megatron's local layers only; set "
                             "megatron.use_transformer_engine=false")
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec

        return get_gpt_layer_with_transformer_engine_spec(qk_layernorm=dims.qk_norm)
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from verlx.workers.megatron.layers import RMSNorm, SDPAttention

    spec = get_gpt_layer_local_spec(num_experts=dims.num_experts or None, moe_grouped_gemm=False,
                                    qk_layernorm=dims.qk_norm, normalization="RMSNorm")
    sub = spec.submodules
    sub.input_layernorm = RMSNorm
    sub.pre_mlp_layernorm = RMSNorm
    attn = sub.self_attention.submodules
    attn.core_attention = SDPAttention
    if dims.qk_norm:
        attn.q_layernorm = RMSNorm
        attn.k_layernorm = RMSNorm
    return TransformerBlockSubmodules(layer_specs=[spec] * local_layers, layer_norm=RMSNorm)


def build_transformer_config(dims: ModelDims, layout: ParallelLayout, mcfg, recompute: bool, use_te: bool,
                             on_cpu: bool) -> TransformerConfig:
    kwargs = transformer_config_kwargs(dims, tp=layout.tp, pp=layout.pp, vpp=layout.vpp, cp=layout.cp,
                                       sequence_parallel=mcfg.sequence_parallel, dtype=mcfg.dtype,
                                       recompute=recompute, use_te=use_te, ep=layout.ep, etp=layout.expert_tp)
    kwargs.update(perform_initialization=False, use_cpu_initialization=on_cpu)
    return TransformerConfig(**transformer_kwargs_with_overrides(kwargs, mcfg.override_transformer_config, use_te))


class RLModelChunk(MegatronModule):
    """One pipeline chunk; the last one carries the head: log-probs (policy) or a scalar value head (critic)."""

    def __init__(self, gpt: GPTModel, dims: ModelDims, value_head: bool):
        super().__init__(config=gpt.config)
        self.gpt = gpt
        self.dims = dims
        self.pre_process, self.post_process = gpt.pre_process, gpt.post_process
        self.is_value = value_head
        self.model_type = gpt.model_type  # read by the pipeline schedules
        if value_head and self.post_process:
            # the GPT trunk of a critic ends at its final norm: no vocabulary projection, which megatron's GPTModel
            # would otherwise look for on the last stage (its checkpoint keys; the tied copy's gradient all-reduce)
            gpt.output_layer = None
            gpt.post_process = False
            self.value_head = torch.nn.Linear(dims.hidden_size, 1, bias=False, dtype=gpt.config.params_dtype,
                                              device=gpt.decoder.final_layernorm.weight.device)
            torch.nn.init.zeros_(self.value_head.weight)

    def set_input_tensor(self, input_tensor) -> None:
        self.gpt.set_input_tensor(input_tensor)

    # megatron's finalize_model_grads reads these from the pipeline's first and last chunk (PP > 1) to all-reduce
    # the gradient of tied embeddings between the two stages
    @property
    def share_embeddings_and_output_weights(self) -> bool:
        return self.gpt.share_embeddings_and_output_weights

    def shared_embedding_or_output_weight(self) -> torch.Tensor:
        return self.gpt.shared_embedding_or_output_weight()

    def _rotary(self, seq_len: int, device: torch.device) -> torch.Tensor:
        inv_freq = self.gpt.rotary_pos_emb.inv_freq.to(device)
        freqs = torch.outer(torch.arange(seq_len, device=device, dtype=inv_freq.dtype), inv_freq)
        return torch.cat([freqs, freqs], dim=-1)[:, None, None, :]

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Hidden states [s (/TP with sequence parallelism), b, h] after this chunk's layers."""
        decoder_input = None
        if self.pre_process:
            decoder_input = self.gpt.embedding(input_ids=input_ids, position_ids=None)
        rotary = self._rotary(input_ids.shape[1], input_ids.device)
        return self.gpt.decoder(hidden_states=decoder_input, attention_mask=None, rotary_pos_emb=rotary)

    # ------------------------------------------------------------------ heads (last stage)
    def _response_hidden(self, hidden: torch.Tensor, batch: AlignedBatch, partial_grads: bool) -> torch.Tensor:
        """[b, R, h] hidden states at the response positions. With `partial_grads` (a vocabulary-parallel head,
        whose hidden-state gradient is each TP rank's partial sum) the backward pass sums them over TP ranks."""
        if self.config.sequence_parallel:
            hidden = tensor_parallel.gather_from_sequence_parallel_region(
                hidden, tensor_parallel_output_grad=partial_grads)
        h = hidden.transpose(0, 1)  # [b, s, h]
        index = batch.hidden_index.unsqueeze(-1).expand(-1, -1, h.shape[-1])
        h = h.gather(1, index)
        if partial_grads and not self.config.sequence_parallel:
            # after the gather, not before: megatron's backward all-reduce works on grad.contiguous() and returns
            # the unreduced grad when that is a copy, which the transpose's gradient would be
            h = tensor_parallel.copy_to_tensor_model_parallel_region(h)
        return h

    def _output_weight(self) -> torch.Tensor:
        return self.gpt.shared_embedding_or_output_weight() if self.gpt.share_embeddings_and_output_weights \
            else self.gpt.output_layer.weight

    def log_probs(self, hidden: torch.Tensor, batch: AlignedBatch, temperature: float, chunk_size: int,
                  with_entropy: bool):
        h = self._response_hidden(hidden, batch, partial_grads=True)
        weight = self._output_weight()
        rows = weight.shape[0]
        return vocab_parallel_log_probs(h, weight, batch.targets, mpu.get_tensor_model_parallel_rank() * rows,
                                        self.dims.vocab_size, temperature, chunk_size, with_entropy,
                                        mpu.get_tensor_model_parallel_group())

    def sum_pi_squared(self, hidden: torch.Tensor, batch: AlignedBatch, temperature: float,
                       chunk_size: int) -> torch.Tensor:
        """sum_v pi_v^2 at the response positions (forward only), shaped like log_probs' output."""
        h = self._response_hidden(hidden, batch, partial_grads=False)
        weight = self._output_weight()
        return vocab_parallel_sum_pi_squared(h, weight, mpu.get_tensor_model_parallel_rank() * weight.shape[0],
                                             self.dims.vocab_size, temperature, chunk_size,
                                             mpu.get_tensor_model_parallel_group())

    def values(self, hidden: torch.Tensor, batch: AlignedBatch) -> torch.Tensor:
        h = self._response_hidden(hidden, batch, partial_grads=False)
        return self.value_head(h).squeeze(-1).float()


def build_chunks(dims: ModelDims, layout: ParallelLayout, config: TransformerConfig, use_te: bool,
                 value_head: bool) -> list[RLModelChunk]:
    """This rank's model chunks (one per virtual pipeline stage), weights uninitialised."""
    if dims.is_moe:
        from verlx.workers.megatron.layers import allow_moe_router_without_transformer_engine

        allow_moe_router_without_transformer_engine()
    chunks = []
    local_layers = (dims.num_layers // (layout.pp * layout.chunks) if layout.vpp else
                    layout.stage_layers(dims.num_layers)[mpu.get_pipeline_model_parallel_rank()])
    kwargs = gpt_model_kwargs(dims, layout.tp)
    if value_head:  # a critic has no vocabulary projection to tie to the embedding (at PP > 1 megatron would keep
        kwargs["share_embeddings_and_output_weights"] = False  # a copy on the last stage and all-reduce its grads)
    for vp in range(layout.chunks):
        vp_stage = vp if layout.vpp else None
        pre = mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        post = mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        gpt = GPTModel(config, layer_spec(dims, use_te, local_layers), pre_process=pre, post_process=post,
                       vp_stage=vp_stage, **kwargs)
        chunks.append(RLModelChunk(gpt, dims, value_head))
    mark_tensor_parallel(chunks, dims, layout)
    return chunks


def mark_tensor_parallel(chunks: list[RLModelChunk], dims: ModelDims, layout: ParallelLayout) -> None:
    """Mark every TP-sharded parameter as megatron does when it initialises weights itself.

    megatron sets `tensor_model_parallel` / `partition_dim` inside its weight initialisation, which loading from
    a checkpoint skips (perform_initialization=False). Unmarked parameters count as copies held by every TP rank,
    so the gradient norm (and the clipping that uses it) left out the shards of every TP rank but the first.
    """
    params, ranks = local_params(chunks), _ranks()
    for spec in param_specs(dims, layout.pp):
        where = placement(spec, dims, layout)
        held = _held_here(spec, where, ranks)
        param = params[where.chunk].get(spec.local_name(where.local_layer, where.local_expert)) if held else None
        if param is None or spec.tp_split == REPLICATED:
            continue
        param.tensor_model_parallel = True
        param.partition_dim = 1 if spec.tp_split == ROW else 0
        param.partition_stride = 1


# ---------------------------------------------------------------------- loading HF weights
class HFCheckpoint:
    """Lazy access to the tensors of a safetensors HF checkpoint (one file or an index of shards)."""

    def __init__(self, path: str):
        self.path = path
        index = os.path.join(path, "model.safetensors.index.json")
        single = os.path.join(path, "model.safetensors")
        if os.path.exists(index):
            with open(index) as f:
                self.files = {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
        elif os.path.exists(single):
            from safetensors import safe_open

            with safe_open(single, framework="pt") as f:
                self.files = {k: single for k in f.keys()}  # noqa: SIM118 - a safetensors handle, not a dict
        else:
            raise FileNotFoundError(f"{path} has no model.safetensors(.index.json); the megatron backend loads "
                                    "safetensors HF checkpoints")

    def __contains__(self, name: str) -> bool:
        return name in self.files

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.files:
            raise KeyError(f"{self.path} has no tensor {name!r}")
        with safe_open(self.files[name], framework="pt") as f:
            return f.get_tensor(name)


def load_hf_weights(chunks: list[RLModelChunk], checkpoint: HFCheckpoint, dims: ModelDims,
                    layout: ParallelLayout) -> None:
    """Copy this rank's slices of the HF weights into its chunks; every chunk parameter must be covered."""
    ranks = _ranks()
    params = local_params(chunks)
    loaded: list[set[str]] = [set() for _ in chunks]
    for spec in param_specs(dims, layout.pp):
        where = placement(spec, dims, layout)
        if not _held_here(spec, where, ranks):
            continue
        name = spec.local_name(where.local_layer, where.local_expert)
        if name not in params[where.chunk]:
            if name == "output_layer.weight" and chunks[where.chunk].is_value:
                continue
            raise KeyError(f"megatron chunk {where.chunk} has no parameter {name} ({te_name(name)} with TE)")
        merged = combine_hf(spec, [checkpoint.get(n) for n in spec.hf_names], dims, layout.tp)
        tp_rank = ranks["etp"] if spec.expert is not None else ranks["tp"]
        shard = tp_shard(spec.tp_split, merged, layout.expert_tp if spec.expert is not None else layout.tp, tp_rank)
        target = params[where.chunk][name]
        if tuple(shard.shape) != tuple(target.shape):
            raise ValueError(f"{name}: HF gives shape {tuple(shard.shape)} for TP rank {tp_rank}, megatron "
                             f"expects {tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(shard)
        loaded[where.chunk].add(name)
    for i, chunk_params in enumerate(params):
        missing = sorted(set(chunk_params) - loaded[i] - {"value_head.weight"})
        if missing:
            raise KeyError(f"no HF tensor was mapped to megatron parameters {missing[:5]} (chunk {i}); "
                           f"is {checkpoint.path} a {dims.architecture} checkpoint?")


def _ranks() -> dict[str, int]:
    """This process's coordinates in megatron's groups."""
    return {"tp": mpu.get_tensor_model_parallel_rank(), "pp": mpu.get_pipeline_model_parallel_rank(),
            "ep": mpu.get_expert_model_parallel_rank(), "etp": mpu.get_expert_tensor_parallel_rank()}


def _held_here(spec, where, ranks: dict[str, int]) -> bool:
    """The parameter lives on this pipeline stage (and, an expert's, on this expert-parallel rank)."""
    return where.pp_rank == ranks["pp"] and (spec.expert is None or where.ep_rank == ranks["ep"])


def local_params(chunks: Iterable[RLModelChunk]) -> list[dict[str, torch.Tensor]]:
    """Per chunk: local-spec name → parameter (the export iterator's view of this rank)."""
    return [{local_spec_name(n.removeprefix("gpt.")): p for n, p in c.named_parameters()} for c in chunks]
