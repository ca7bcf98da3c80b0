"""Trainer-side model wrappers whose forward returns what RL needs, never the full logits.

Wrapping matters for FSDP2: the root FSDP unit is the wrapper, so the embeddings, final norm and lm_head are
gathered in its pre-forward hook even though we call the decoder and project hidden states ourselves.
"""

from __future__ import annotations

import torch
from torch import nn

from verlx.models.attention import packed_attention_kwargs, prepared_packed_mask, use_packed_attention
from verlx.models.chunked_logprob import chunked_full_kl, chunked_log_probs, chunked_sum_pi_squared
from verlx.models.packing import HostCopy, ResponseRows, pack_batch, pack_tokens
from verlx.models.topk_distillation import chunked_topk_forward_kl, chunked_topk_log_probs
from verlx.models.vision import VisionLanguageBody, VisionLanguageModel, prompt_image_mask


def decoder_layers(hf_model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (the FSDP units), found by the model's own no-split module names."""
    names = set(getattr(hf_model, "_no_split_modules", None) or [])
    layers = [m for m in hf_model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(hf_model).__name__} (its _no_split_modules is {sorted(names)})"
        )
    return layers


def _decoder_forward(decoder: nn.Module, input_ids, attention_mask, position_ids, **kwargs) -> torch.Tensor:
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False,
                  **kwargs)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


def packed_decoder_forward(decoder: nn.Module, input_ids, position_ids, **attention_kwargs) -> torch.Tensor:
    """The decoder on a packed [1, T] row; `attention_kwargs` from packed_attention_kwargs."""
    return _decoder_forward(decoder, input_ids, prepared_packed_mask(input_ids.device), position_ids,
                            **attention_kwargs)


def response_rows(decoder: nn.Module, input_ids, attention_mask, position_ids, response_length: int, packed: bool,
                  sp_group=None, host_mask: HostCopy | None = None,
                  token_inputs: dict[str, torch.Tensor] | None = None) -> ResponseRows:
    """Run the decoder and pick the hidden states that predict the response tokens (padded or packed); packing
    reads `host_mask` (the attention mask's host copy), when given, instead of copying the device mask back.
    `token_inputs`: more [B, P + R] per-token inputs of the decoder (keyword arguments), packed like the tokens."""
    token_inputs = token_inputs or {}
    if not packed:
        hidden = _decoder_forward(decoder, input_ids, attention_mask, position_ids, **token_inputs)
        # the hidden state at position t predicts token t+1: the last response_length+1 positions but one
        return ResponseRows.padded(hidden[:, -response_length - 1 : -1], input_ids[:, -response_length:])
    sp = torch.distributed.get_world_size(sp_group) if sp_group is not None else 1
    batch = pack_batch(input_ids, attention_mask, position_ids, response_length, pad_multiple=sp,
                       host_mask=host_mask.tensor if host_mask is not None else None)
    ids, pos = batch.input_ids, batch.position_ids
    per_token = {name: pack_tokens(values, batch) for name, values in token_inputs.items()}
    if sp > 1:
        local = ids.shape[1] // sp
        start = torch.distributed.get_rank(sp_group) * local
        ids, pos = ids[:, start : start + local], pos[..., start : start + local]
        per_token = {name: values[:, start : start + local] for name, values in per_token.items()}
    kwargs = packed_attention_kwargs(batch.cu_seqlens, batch.cu_seqlens_host, sp_group if sp > 1 else None)
    kwargs.update(per_token)
    hidden = packed_decoder_forward(decoder, ids, pos, **kwargs)
    return ResponseRows.packed(hidden[0], batch, sp_group if sp > 1 else None)


class PolicyModel(nn.Module):
    """A HF causal LM; forward gives log-probs (and entropy) of the response tokens under temperature T.

    packed=True runs the decoder on the micro-batch's real tokens only (remove-padding, `verlx.models.packing`),
    optionally split over a Ulysses sequence-parallel group; inputs and outputs keep the padded layout.
    A vision-language model (`vision`) takes position_ids [B, 4, T] (verlx.models.mrope) and each call's
    `vision_inputs` (verlx.models.vision.micro_batch_vision).
    """

    def __init__(self, hf_model: nn.Module, packed: bool = False, sp_group=None,
                 vision: VisionLanguageModel | None = None):
        super().__init__()
        if sp_group is not None and not packed:
            raise ValueError("Ulysses sequence parallelism needs packed sequences (use_remove_padding=True)")
        if sp_group is not None and vision is not None:
            raise ValueError("Ulysses sequence parallelism does not support vision-language models yet")
        self.hf_model = hf_model
        self.packed = packed
        self.sp_group = sp_group
        self.vision = vision
        self.compiled = False  # verlx.models.compile.compile_model sets it: fused log-prob chunks too
        if packed:
            use_packed_attention(hf_model)

    @property
    def config(self):
        return self.hf_model.config

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor,
        response_length: int,
        temperature: float = 1.0,
        chunk_size: int = 1024,
        with_entropy: bool = False,
        kl_reference: tuple[torch.Tensor, torch.Tensor] | None = None,
        return_response_hidden: bool = False,
        with_sum_pi_squared: bool = False,
        host_mask: HostCopy | None = None,
        vision_inputs: dict[str, torch.Tensor] | None = None,
        topk: int = 0,
        teacher_topk: tuple[torch.Tensor, torch.Tensor, float | None] | None = None,
    ):
        """(log_probs, entropy) of the response tokens, [B, R] each; plus the exact per-token KL to `kl_reference`
        (the reference's response hidden states [B, R, H] and output weight) when given; plus, last, sum_v pi_v^2
        per token (no gradient) with with_sum_pi_squared; then, with `topk`, this model's top-k token ids and
        log-probs [B, R, k] (a distillation teacher's); then, with `teacher_topk` (those ids and log-probs, and the
        clamp of log-probs or None), the forward KL over them and this model's mass on them, [B, R] each
        (verlx.models.topk_distillation). With return_response_hidden, returns instead this model's
        (response hidden states [B, R, H], output weight), detached copies, for use as another model's
        kl_reference. Packed: zeros where the response is padding; `host_mask` spares packing a device sync."""
        decoder, token_inputs = self.hf_model.get_decoder(), None
        if self.vision is not None:  # an image token the policy generated is text: only the prompt's take images
            decoder = VisionLanguageBody(self.hf_model, self.vision, vision_inputs)
            token_inputs = {"image_mask": prompt_image_mask(input_ids, response_length, self.vision)}
        rows = response_rows(decoder, input_ids, attention_mask, position_ids, response_length, self.packed,
                             self.sp_group, host_mask, token_inputs)
        weight = self.hf_model.get_output_embeddings().weight
        if return_response_hidden:
            return rows.assemble(rows.hidden.detach()).clone(), weight.detach().clone()
        log_probs, entropy = chunked_log_probs(rows.hidden, weight, rows.targets, temperature, chunk_size,
                                               with_entropy, compiled=self.compiled)
        log_probs = _owned(rows.assemble(log_probs))
        entropy = _owned(rows.assemble(entropy)) if entropy is not None else None
        outputs = (log_probs, entropy)
        if kl_reference is not None:
            ref_hidden, ref_weight = kl_reference
            full_kl = chunked_full_kl(rows.hidden, weight, rows.select(ref_hidden), ref_weight,
                                      temperature=temperature, chunk_size=chunk_size)
            outputs += (_owned(rows.assemble(full_kl)),)
        if with_sum_pi_squared:
            outputs += (rows.assemble(chunked_sum_pi_squared(rows.hidden, weight, temperature, chunk_size)),)
        if topk:
            ids, top_log_probs = chunked_topk_log_probs(rows.hidden, weight, topk, temperature, chunk_size)
            outputs += (rows.assemble(ids), rows.assemble(top_log_probs))
        if teacher_topk is not None:
            ids, top_log_probs, min_clamp = teacher_topk
            kl, mass = chunked_topk_forward_kl(rows.hidden, weight, rows.select(ids), rows.select(top_log_probs),
                                               temperature, chunk_size, min_clamp)
            outputs += (_owned(rows.assemble(kl)), rows.assemble(mass))
        return outputs


class ValueModel(nn.Module):
    """A HF decoder with a scalar value head; forward gives the value at each response position."""

    def __init__(self, decoder: nn.Module, hidden_size: int, packed: bool = False, sp_group=None):
        super().__init__()
        if sp_group is not None and not packed:
            raise ValueError("Ulysses sequence parallelism needs packed sequences (use_remove_padding=True)")
        self.decoder = decoder
        self.value_head = nn.Linear(hidden_size, 1, bias=False)
        nn.init.zeros_(self.value_head.weight)
        self.packed = packed
        self.sp_group = sp_group
        if packed:
            use_packed_attention(decoder)

    @property
    def config(self):
        return self.decoder.config

    def forward(self, input_ids, attention_mask, position_ids, response_length: int,
                host_mask: HostCopy | None = None) -> torch.Tensor:
        rows = response_rows(self.decoder, input_ids, attention_mask, position_ids, response_length, self.packed,
                             self.sp_group, host_mask)
        values = self.value_head(rows.hidden.to(self.value_head.weight.dtype)).squeeze(-1).float()
        return _owned(rows.assemble(values))


def _owned(t: torch.Tensor) -> torch.Tensor:
    """A root FSDP module must not return a view: an in-place op on it would skip FSDP's pre-backward hook (and
    FSDP warns every call). One [B, R] copy makes the output its own tensor."""
    return t.clone() if t._base is not None else t
