"""The embedded default model: tokenizer round trip, chat template, special ids, shape, save/load."""

from __future__ import annotations

import json
import os

import pytest
import torch

from verlx.models.tiny import (
    TinyModelSpec,
    build_model,
    build_tokenizer,
    main,
    save_tiny_model,
)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return save_tiny_model(str(tmp_path_factory.mktemp("tiny")), seed=0)


TEXTS = [
    "12+34=?",
    "#### 46",
    "  two  spaces\tand a tab\nnew line\n\n",
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n#### 72",
    "naïve café € 😀",  # non-ASCII: several bytes per character
]


def test_ascii_is_one_token_per_character_with_id_equal_to_byte():
    tok = build_tokenizer()
    # ord: '1'=49 '2'=50 '+'=43 '3'=51 '4'=52 '='=61 '?'=63
    assert tok("12+34=?", add_special_tokens=False)["input_ids"] == [49, 50, 43, 51, 52, 61, 63]
    # ' '=32 '\t'=9 '\n'=10
    assert tok(" \t\n", add_special_tokens=False)["input_ids"] == [32, 9, 10]
    # '€' is UTF-8 e2 82 ac
    assert tok("€", add_special_tokens=False)["input_ids"] == [0xE2, 0x82, 0xAC]


def test_special_tokens():
    tok = build_tokenizer()
    assert len(tok) == 259
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [256, 257, 258]
    assert (tok.eos_token, tok.eos_token_id, tok.pad_token_id) == ("<|endoftext|>", 256, 256)
    # special tokens in text are single ids, not characters
    assert tok("a<|im_end|>b", add_special_tokens=False)["input_ids"] == [97, 258, 98]


def test_saved_tokenizer_round_trips(tiny_dir):
    from transformers import AutoTokenizer

    built, loaded = build_tokenizer(), AutoTokenizer.from_pretrained(tiny_dir)
    for text in TEXTS:
        ids = loaded(text, add_special_tokens=False)["input_ids"]
        assert ids == built(text, add_special_tokens=False)["input_ids"]
        assert loaded.decode(ids, skip_special_tokens=True) == text
    with_special = "<|im_start|>user\n1+1=?<|im_end|>\n"
    ids = loaded(with_special, add_special_tokens=False)["input_ids"]
    assert loaded.decode(ids) == with_special
    assert loaded.decode(ids, skip_special_tokens=True) == "user\n1+1=?\n"
    assert loaded.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [256, 257, 258]


def test_tokenizer_config_is_readable_by_transformers_4(tiny_dir):
    """4.x cannot parse 5.x's list-valued extra_special_tokens; the saved config uses the portable keys."""
    with open(os.path.join(tiny_dir, "tokenizer_config.json")) as f:
        config = json.load(f)
    assert config["tokenizer_class"] == "Qwen2Tokenizer"
    assert "extra_special_tokens" not in config
    assert config["additional_special_tokens"] == ["<|im_start|>", "<|im_end|>"]


def test_chat_template(tiny_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    user = [{"role": "user", "content": "12+34=?"}]
    prompt = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\n12+34=?<|im_end|>\n<|im_start|>assistant\n"
    turn = user + [{"role": "assistant", "content": "#### 46"}]
    full = tok.apply_chat_template(turn, tokenize=False)
    assert full == "<|im_start|>user\n12+34=?<|im_end|>\n<|im_start|>assistant\n#### 46<|im_end|>\n"
    # "<|im_start|>" + "user\n" (5) + "12+34=?" (7) + "<|im_end|>" + "\n" + "<|im_start|>" + "assistant\n" (10) = 26
    assert len(tok(prompt, add_special_tokens=False)["input_ids"]) == 26


def test_model_shape_parameter_count_and_stop_tokens(tiny_dir):
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads) == (128, 4, 4, 2)
    shape = (c.intermediate_size, c.vocab_size, c.max_position_embeddings, c.tie_word_embeddings)
    assert shape == (384, 259, 512, True)
    # embeddings (tied with lm_head): 259*128 = 33,152
    # per layer: q 128*128+128 = 16,512; k, v 128*64+64 = 8,256 each; o 128*128 = 16,384  -> 49,408
    #            mlp 3*128*384 = 147,456; two RMSNorms 2*128 = 256                       -> 197,120
    # 4 layers = 788,480; final norm 128; total 33,152 + 788,480 + 128 = 821,760
    assert sum(p.numel() for p in model.parameters()) == 821_760
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert c.eos_token_id == 258
    gen = GenerationConfig.from_pretrained(tiny_dir)
    assert gen.eos_token_id == [258, 256] and gen.pad_token_id == 256


def test_init_is_seeded():
    a, b, c = build_model(seed=0), build_model(seed=0), build_model(seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.mlp.up_proj.weight"], sc["model.layers.0.mlp.up_proj.weight"])


@pytest.mark.parametrize("stop_id", [258, 256])
def test_generation_stops_at_either_stop_token(tiny_dir, stop_id):
    """Tokens are forced ('1', '1', '1', stop, then 'x' forever); generation must end at the stop token by itself."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "1+1=?"}], tokenize=False, add_generation_prompt=True)
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    forced = [49, 49, 49, stop_id]

    def allowed(batch_id, sequence):
        produced = len(sequence) - ids.shape[1]
        return [forced[produced]] if produced < len(forced) else [ord("x")]

    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), max_new_tokens=10, do_sample=False, prefix_allowed_tokens_fn=allowed
    )
    assert out[0, ids.shape[1] :].tolist() == forced


def test_cli_writes_a_loadable_directory(tmp_path, capsys):
    from transformers import AutoModelForCausalLM

    main(["--output_dir", str(tmp_path / "m"), "--seed", "3"])
    assert "821,760 parameters" in capsys.readouterr().out
    for name in ("config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
                 "tokenizer_config.json"):
        assert os.path.isfile(tmp_path / "m" / name), name
    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "m")).state_dict()
    fresh = build_model(TinyModelSpec(), seed=3).state_dict()
    assert all(torch.equal(loaded[k], fresh[k]) for k in fresh)
