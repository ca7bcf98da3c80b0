"""A tiny character-level ChatML tokenizer for tests (test-only; the project's real one is verlx/models/tiny.py).

Every printable ASCII character and newline is one token; anything else is <unk>. <|im_start|>, <|im_end|> and
<|endoftext|> are special tokens (<|endoftext|> doubles as eos and pad).
"""

from __future__ import annotations

import string

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>"]
CHARS = sorted(set(string.printable) - set("\t\r\x0b\x0c"))
CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_tiny_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + CHARS)}
    # BPE without merges is a character model (and twice as fast as WordLevel over a per-character split).
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        unk_token="<unk>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def save_tiny_qwen2(path, hidden_size: int = 64, intermediate_size: int = 128, num_hidden_layers: int = 2,
                    seed: int = 0) -> str:
    """A Qwen2 (GQA 4/2 heads, tied embeddings, random weights drawn with `seed`) with the character-level tokenizer
    and a generation config whose eos ids are <|im_end|> and the tokenizer's eos, saved to `path`."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = build_tiny_tokenizer()
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=hidden_size, intermediate_size=intermediate_size,
                      num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32768, tie_word_embeddings=True, eos_token_id=im_end,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    Qwen2ForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    GenerationConfig(eos_token_id=[im_end, tok.eos_token_id], pad_token_id=tok.pad_token_id).save_pretrained(path)
    return str(path)


# A template unlike ChatML, for a reward model whose chat format differs from the policy's (re-templating).
PLAIN_TEMPLATE = "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"


def save_tiny_reward_model(path, chat_template: str = PLAIN_TEMPLATE, seed: int = 1) -> str:
    """A Qwen2ForSequenceClassification (one label, random weights) on the character-level tokenizer with its own
    chat template, saved with save_pretrained: the reward-model checkpoint of the tests."""
    import torch
    from transformers import Qwen2Config, Qwen2ForSequenceClassification

    tok = build_tiny_tokenizer()
    tok.chat_template = chat_template
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                      tie_word_embeddings=False, pad_token_id=tok.pad_token_id, num_labels=1)
    torch.manual_seed(seed)
    model = Qwen2ForSequenceClassification(cfg)
    torch.nn.init.normal_(model.score.weight, std=1.0)  # scores of order 1, far apart
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)
