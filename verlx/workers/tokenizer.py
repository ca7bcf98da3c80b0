"""Tokenizer loading and the token ids that end a response."""

from __future__ import annotations

import glob
import logging
import os

from verlx.config.loader import ConfigError

logger = logging.getLogger(__name__)


# Files that hold a tokenizer's vocabulary, one tuple per format; a directory needs every file of one of them.
VOCABULARY_FILES = (
    ("tokenizer.json",),            # tokenizers (fast) format, what save_pretrained writes
    ("vocab.json", "merges.txt"),   # byte-level BPE (GPT-2, Qwen2)
    ("tokenizer.model",),           # SentencePiece (Llama 2, Mistral, Gemma)
    ("spiece.model",),              # SentencePiece (T5)
    ("sentencepiece.bpe.model",),   # SentencePiece (XLM-R)
    ("vocab.txt",),                 # WordPiece (BERT)
    ("*.tiktoken",),                # tiktoken
)
EXPECTED_FILES = ("tokenizer.json (+ tokenizer_config.json), or vocab.json + merges.txt, or a SentencePiece "
                  "tokenizer.model, or vocab.txt, or *.tiktoken")


def tokenizer_files_problem(directory: str, key: str) -> str | None:
    """What is wrong when `directory` holds no tokenizer vocabulary: transformers would then quietly build an empty
    tokenizer (1 token), every prompt would become 0 tokens and the run would fail much later, blaming the data."""
    directory = os.path.expanduser(directory)
    if not os.path.isdir(directory):
        return None  # not a directory: from_pretrained reports it
    if any(all(glob.glob(os.path.join(directory, name)) for name in files) for files in VOCABULARY_FILES):
        return None
    return f"{key}: {directory} has no tokenizer files (expected {EXPECTED_FILES}); {_what_to_do(key, directory)}"


def vocabulary_problem(tokenizer, directory: str, key: str) -> str | None:
    if len(tokenizer) > 1:
        return None
    return (f"{key}: the tokenizer loaded from {directory} has {len(tokenizer)} token(s), so every prompt would be "
            f"empty: its tokenizer files ({EXPECTED_FILES}) are missing or broken; {_what_to_do(key, directory)}")


def _what_to_do(key: str, directory: str) -> str:
    copy = f"copy the base model's tokenizer files into {directory}"
    if key.endswith(".path"):  # a model directory: its section also has a tokenizer_path key
        tokenizer_key = key.removesuffix("path") + "tokenizer_path"
        return f"set {tokenizer_key} to a directory that has them (e.g. the base model), or {copy}"
    if key.endswith("tokenizer_path"):
        return f"point {key} at a directory that has them"
    return copy


def checked_tokenizer(path: str, trust_remote_code: bool = False, key: str = "actor_rollout_ref.model.path"):
    """AutoTokenizer of `path`, refused (ConfigError naming `key`) when the directory has no usable vocabulary.

    Custom tokenizers (trust_remote_code) may keep their vocabulary under other names: only their size is checked.
    """
    from transformers import AutoTokenizer

    path = os.path.expanduser(path)
    problem = None if trust_remote_code else tokenizer_files_problem(path, key)
    if problem is not None:
        raise ConfigError([problem])
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception as e:
        raise RuntimeError(f"could not load a tokenizer from {path!r}: {e}") from e
    problem = vocabulary_problem(tokenizer, path, key)
    if problem is not None:
        raise ConfigError([problem])
    return tokenizer


def load_tokenizer(path: str, trust_remote_code: bool = False, custom_chat_template: str | None = None,
                   key: str = "actor_rollout_ref.model.path"):
    """checked_tokenizer with a pad token (the eos token when the model has none) and an optional chat template."""
    tokenizer = checked_tokenizer(path, trust_remote_code, key)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.warning("tokenizer at %s has no pad token; using the eos token %r", path, tokenizer.eos_token)
    if custom_chat_template is not None:
        tokenizer.chat_template = custom_chat_template
    return tokenizer


def stop_token_ids(tokenizer, model_path: str) -> list[int]:
    """generation_config.eos_token_id (int or list) when the model has one, else the tokenizer's eos id."""
    from transformers import GenerationConfig

    ids: list[int] = []
    try:
        eos = GenerationConfig.from_pretrained(os.path.expanduser(model_path)).eos_token_id
        ids = [eos] if isinstance(eos, int) else list(eos or [])
    except (OSError, ValueError):
        pass
    if not ids and tokenizer.eos_token_id is not None:
        ids = [tokenizer.eos_token_id]
    if not ids:
        raise ValueError(f"no eos token: neither {model_path}/generation_config.json nor the tokenizer define one")
    return ids
