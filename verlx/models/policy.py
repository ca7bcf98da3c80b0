"""Trainer-side model wrappers whose forward returns what RL needs, never the full logits.

Wrapping matters for FSDP2: the root FSDP unit is the wrapper, so the embeddings, final norm and lm_head are
gathered in its pre-forward hook even though we call the decoder and project hidden states ourselves.
"""

from __future__ import annotations

import torch
from torch import nn

from verlx.models.chunked_logprob import chunked_full_kl, chunked_log_probs


def decoder_layers(hf_model: nn.Module) -> list[nn.Module]:
    """The repeated transformer blocks (the FSDP units), found by the model's own no-split module names."""
    names = set(getattr(hf_model, "_no_split_modules", None) or [])
    layers = [m for m in hf_model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(hf_model).__name__} (its _no_split_modules is {sorted(names)})"
        )
    return layers


def _decoder_forward(decoder: nn.Module, input_ids, attention_mask, position_ids) -> torch.Tensor:
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False)
    return out.last_hidden_state if hasattr(out, "last_hidden_state") else out[0]


class PolicyModel(nn.Module):
    """A HF causal LM; forward gives log-probs (and entropy) of the response tokens under temperature T."""

    def __init__(self, hf_model: nn.Module):
        super().__init__()
        self.hf_model = hf_model

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
    ):
        """(log_probs, entropy) of the response tokens; plus the exact per-token KL to `kl_reference` (the reference's
        response hidden states and output weight) when given. With return_response_hidden, returns instead this
        model's (response hidden states, output weight), detached copies, for use as another model's kl_reference."""
        hidden = _decoder_forward(self.hf_model.get_decoder(), input_ids, attention_mask, position_ids)
        # the hidden state at position t predicts token t+1: the last response_length+1 positions but one
        h = hidden[:, -response_length - 1 : -1]
        weight = self.hf_model.get_output_embeddings().weight
        if return_response_hidden:
            return h.detach().clone(), weight.detach().clone()
        targets = input_ids[:, -response_length:]
        log_probs, entropy = chunked_log_probs(h, weight, targets, temperature, chunk_size, with_entropy)
        if kl_reference is None:
            return log_probs, entropy
        full_kl = chunked_full_kl(h, weight, *kl_reference, temperature=temperature, chunk_size=chunk_size)
        return log_probs, entropy, full_kl

    def hf_state_dict_key(self, key: str) -> str:
        return key.removeprefix("hf_model.")


class ValueModel(nn.Module):
    """A HF decoder with a scalar value head; forward gives the value at each response position."""

    def __init__(self, decoder: nn.Module, hidden_size: int):
        super().__init__()
        self.decoder = decoder
        self.value_head = nn.Linear(hidden_size, 1, bias=False)
        nn.init.zeros_(self.value_head.weight)

    @property
    def config(self):
        return self.decoder.config

    def forward(self, input_ids, attention_mask, position_ids, response_length: int) -> torch.Tensor:
        hidden = _decoder_forward(self.decoder, input_ids, attention_mask, position_ids)
        h = hidden[:, -response_length - 1 : -1]
        return self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1).float()
