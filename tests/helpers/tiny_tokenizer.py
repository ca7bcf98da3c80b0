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
