"""Tiny HF checkpoints and prompt batches for the native-engine tests (built here, never downloaded)."""

from __future__ import annotations

import torch
import transformers

from verlx.config.roles import EngineKwargs, RolloutConfig
from verlx.protocol import DataProto
from verlx.rollout.base import RolloutContext

VOCAB = 96
PAD, EOS = 0, 1
_COMMON = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
    num_key_value_heads=2, max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS, bos_token_id=2,
    initializer_range=0.3,  # large enough that greedy continuations wander instead of repeating one token
)


def tiny_config(kind: str):
    if kind == "qwen2":
        return transformers.Qwen2Config(**_COMMON, tie_word_embeddings=True)
    if kind == "qwen3":
        return transformers.Qwen3Config(**_COMMON, head_dim=32, tie_word_embeddings=False)
    if kind == "llama3":
        scaling = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                       original_max_position_embeddings=16)
        return transformers.LlamaConfig(**_COMMON, rope_scaling=scaling, tie_word_embeddings=False)
    if kind == "mistral":
        return transformers.MistralConfig(**{**_COMMON, "num_key_value_heads": 1}, sliding_window=4096)
    if kind == "mistral_window":  # window shorter than the test sequences, so it really cuts attention
        return transformers.MistralConfig(**{**_COMMON, "num_key_value_heads": 1}, sliding_window=6)
    if kind == "llama_yarn":
        scaling = dict(rope_type="yarn", factor=4.0, original_max_position_embeddings=64)
        return transformers.LlamaConfig(**_COMMON, rope_scaling=scaling)
    if kind == "llama_linear":
        return transformers.LlamaConfig(**_COMMON, rope_scaling=dict(rope_type="linear", factor=2.0))
    raise ValueError(kind)


def save_tiny_model(kind: str, path, seed: int = 0):
    """Random float32 HF model saved with save_pretrained; returns (model, config reloaded from disk)."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(tiny_config(kind), attn_implementation="sdpa")
    model = model.float().eval()
    model.save_pretrained(path)
    return model, transformers.AutoConfig.from_pretrained(path)


def rollout_context(path, hf_config, *, response_length=32, prompt_length=16, eos=(EOS,), **overrides):
    fields = dict(prompt_length=prompt_length, response_length=response_length, dtype="float32",
                  load_format="auto", max_num_seqs=8)
    fields.update(overrides)
    if "engine_kwargs" in fields:
        fields["engine_kwargs"] = EngineKwargs(**fields["engine_kwargs"])
    config = RolloutConfig(**fields)
    return RolloutContext(config=config, model_path=str(path), hf_config=hf_config, device=torch.device("cpu"),
                          pad_token_id=PAD, eos_token_ids=list(eos))


def ragged_prompts(batch: int, width: int, seed: int = 0, min_len: int = 3) -> DataProto:
    """Left-padded random prompts of lengths in [min_len, width] (the first row uses the full width)."""
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(min_len, width + 1, (batch,), generator=gen)
    lens[0] = width
    ids = torch.full((batch, width), PAD, dtype=torch.long)
    mask = torch.zeros(batch, width, dtype=torch.long)
    for i, n in enumerate(lens.tolist()):
        ids[i, width - n :] = torch.randint(3, VOCAB, (n,), generator=gen)
        mask[i, width - n :] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def with_meta(prompts: DataProto, **meta) -> DataProto:
    return DataProto(dict(prompts.batch), dict(prompts.non_tensor_batch), {**prompts.meta_info, **meta})


def hf_greedy(model, prompts: DataProto, new_tokens: int, **kwargs) -> torch.Tensor:
    """transformers greedy generate, responses right-padded to new_tokens with PAD."""
    ids = prompts.batch["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=prompts.batch["attention_mask"], max_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=PAD, **kwargs)
    responses = out[:, ids.shape[1] :]
    pad = torch.full((ids.shape[0], new_tokens - responses.shape[1]), PAD, dtype=responses.dtype)
    return torch.cat([responses, pad], dim=1)


def hf_token_logprobs(model, batch: DataProto, temperature: float) -> torch.Tensor:
    """log_softmax(HF logits / T) at each response token of a rollout batch: [rows, response_length]."""
    with torch.no_grad():
        logits = model(input_ids=batch.batch["input_ids"], attention_mask=batch.batch["attention_mask"],
                       position_ids=batch.batch["position_ids"]).logits
    width = batch.batch["responses"].shape[1]
    logits = logits[:, -width - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, batch.batch["responses"][..., None]).squeeze(-1)
