"""The embedded default model: a ~0.8M-parameter Qwen2 with a byte-level (one token per character) ChatML tokenizer.

The quick start has no model hub, so it builds its policy here and saves it with `save_pretrained`; every trainer
then loads it through the same `from_pretrained(path)` path a real checkpoint takes. One token per byte keeps the
vocabulary at 259, so the whole model fits a 2-core CPU budget, and digits are single tokens (arithmetic friendly).

    python -m verlx.models.tiny --output_dir ~/models/verlx-tiny [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import asdict, dataclass

from verlx.utils.paths import expand_path

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
# The pre-tokenizer split of Qwen2's tokenizer; with no merges every byte stays its own token, but the split must
# match so that transformers 5 (which rebuilds qwen2 tokenizers from their vocabulary) tokenizes identically.
QWEN2_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""  # noqa: E501
)

# ChatML without a default system prompt: every message is "<|im_start|>{role}\n{content}<|im_end|>\n".
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the default model (Qwen2 architecture)."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    initializer_range: float = 0.02


def byte_symbols() -> list[str]:
    """The byte-level alphabet: byte b is written as one printable unicode character (the GPT-2/Qwen2 convention).

    Bytes that are printable and not whitespace stand for themselves; the rest are shifted past 255 in order.
    """
    keeps = set(range(ord("!"), ord("~") + 1)) | set(range(0xA1, 0xAC + 1)) | set(range(0xAE, 0xFF + 1))
    symbols, shifted = [], 0
    for b in range(256):
        if b in keeps:
            symbols.append(chr(b))
        else:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def vocabulary() -> dict[str, int]:
    """Token → id: byte b has id b (so '0' is 48), then <|endoftext|>, <|im_start|>, <|im_end|> (256..258)."""
    tokens = byte_symbols() + list(SPECIAL_TOKENS)
    return {tok: i for i, tok in enumerate(tokens)}


def build_tokenizer(model_max_length: int = 512):
    """A byte-level BPE tokenizer without merges: every UTF-8 byte is one token, so no text is unknown.

    It is Qwen2's tokenizer pipeline (NFC, regex split, byte-level, BPE) with an empty merge list, so whichever class
    transformers picks to load it (PreTrainedTokenizerFast, Qwen2TokenizerFast, 5.x Qwen2Tokenizer) gives the same ids.
    """
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
    )
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE(vocab=vocabulary(), merges=[], fuse_unk=False, byte_fallback=False))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=ENDOFTEXT,
        pad_token=ENDOFTEXT,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        chat_template=CHAT_TEMPLATE,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )


def build_config(spec: TinyModelSpec = TinyModelSpec()):
    """The Qwen2Config of the default model; eos is <|im_end|> (end of the assistant turn)."""
    from transformers import Qwen2Config

    vocab = vocabulary()
    return Qwen2Config(
        vocab_size=len(vocab),
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=None,
        bos_token_id=vocab[ENDOFTEXT],
        eos_token_id=vocab[IM_END],
        pad_token_id=vocab[ENDOFTEXT],
        **asdict(spec),
    )


def build_generation_config():
    """Both <|im_end|> and <|endoftext|> stop generation; trainers read the stop ids from here."""
    from transformers import GenerationConfig

    vocab = vocabulary()
    return GenerationConfig(
        eos_token_id=[vocab[IM_END], vocab[ENDOFTEXT]],
        pad_token_id=vocab[ENDOFTEXT],
        bos_token_id=vocab[ENDOFTEXT],
        do_sample=False,
    )


def build_model(spec: TinyModelSpec = TinyModelSpec(), seed: int = 0):
    """A freshly initialised Qwen2ForCausalLM (fp32), deterministic for a given seed."""
    import torch
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(build_config(spec))
    model.generation_config = build_generation_config()
    return model


def save_tiny_model(output_dir: str, seed: int = 0, spec: TinyModelSpec = TinyModelSpec()) -> str:
    """Write model (safetensors), tokenizer and generation config to `output_dir`; return its absolute path."""
    output_dir = expand_path(output_dir, absolute=True)
    model = build_model(spec, seed)
    tokenizer = build_tokenizer(spec.max_position_embeddings)
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    _portable_tokenizer_config(output_dir)
    return output_dir


def _portable_tokenizer_config(output_dir: str) -> None:
    """Write tokenizer_config.json in the form transformers 4.x and 5.x both read.

    5.x writes its backend class name and a list under `extra_special_tokens`, which 4.x cannot parse; Qwen2's own
    class name and `additional_special_tokens` load everywhere.
    """
    path = os.path.join(output_dir, "tokenizer_config.json")
    with open(path) as f:
        config = json.load(f)
    config["tokenizer_class"] = "Qwen2Tokenizer"
    config.pop("extra_special_tokens", None)
    config.pop("backend", None)
    config["additional_special_tokens"] = [IM_START, IM_END]
    config["unk_token"] = None
    config["bos_token"] = None
    config["add_prefix_space"] = False
    with open(path, "w") as f:
        json.dump(config, f, indent=2, ensure_ascii=False)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output_dir", required=True, help="directory to write the model and tokenizer into")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weight initialisation")
    args = parser.parse_args(argv)
    path = save_tiny_model(args.output_dir, seed=args.seed)
    n_params = sum(p.numel() for p in build_model().parameters())
    print(f"saved tiny Qwen2 ({n_params:,} parameters, vocab {len(vocabulary())}) to {path}")


if __name__ == "__main__":
    main()
