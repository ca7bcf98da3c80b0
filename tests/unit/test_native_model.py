"""The native decoder against transformers: logits parity per architecture and RoPE variant, weight mapping."""

from __future__ import annotations

import pytest
import torch
import transformers

from native_models import VOCAB, save_tiny_model, tiny_config
from verlx.rollout.native.architectures import model_spec
from verlx.rollout.native.kv_cache import KVCache, plan_cache
from verlx.rollout.native.model import NativeModel
from verlx.rollout.native.rope import rope_tables
from verlx.rollout.native.weights import WeightStore, iter_checkpoint


def native_model(hf_config, path, max_len=64):
    spec = model_spec(hf_config)
    weights = WeightStore(spec, torch.float32, torch.device("cpu"))
    weights.allocate()
    weights.copy_named(iter_checkpoint(str(path)))
    cos, sin = rope_tables(hf_config, spec.head_dim, max_len, torch.float32, "cpu")
    return NativeModel(spec, weights, cos, sin)


@pytest.mark.parametrize(
    "kind", ["qwen2", "qwen3", "llama3", "mistral", "mistral_window", "llama_yarn", "llama_linear"]
)
def test_logits_match_transformers(kind, tmp_path):
    hf, config = save_tiny_model(kind, tmp_path)
    model = native_model(config, tmp_path)
    tokens = torch.randint(0, VOCAB, (3, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected = hf(tokens).logits
        got = model.score(tokens)
    # same op order as HF in float32: differences are rounding only
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_architecture_features_follow_the_config(tmp_path):
    qwen2 = model_spec(tiny_config("qwen2"))
    assert qwen2.features.qkv_bias and not qwen2.features.o_bias and qwen2.tie_word_embeddings
    qwen3 = model_spec(tiny_config("qwen3"))
    assert qwen3.features.qk_norm and qwen3.head_dim == 32 and not qwen3.features.qkv_bias
    assert model_spec(tiny_config("mistral_window")).sliding_windows == (6, 6)
    assert model_spec(tiny_config("llama3")).sliding_windows == (None, None)
    # 4 query heads over 2 KV heads: groups of 2; qkv rows = (4 + 2*2) * 16
    assert qwen2.group_size == 2 and qwen2.qkv_rows == 8 * 16


def test_decode_with_cache_matches_full_forward(tmp_path):
    """Prefill a prompt into slot 1 of a cache, then decode 5 tokens one by one: each step's logits equal the
    full-sequence forward at that position (same model, same weights)."""
    _, config = save_tiny_model("qwen3", tmp_path)
    model = native_model(config, tmp_path)
    spec = model.spec
    plan = plan_cache(spec, torch.float32, torch.device("cpu"), max_len=64, max_num_seqs=3, kv_cache_tokens=None,
                      gpu_memory_utilization=0.5, weight_bytes=0, prefill_tokens=64)
    cache = KVCache(spec, plan, torch.float32, torch.device("cpu"))
    seq = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(3))
    full = model.score(seq)[0]
    model.forward_prompt(seq[:, :7], cache, torch.tensor([1]), torch.tensor([0]))
    for p in range(7, 12):
        tokens = torch.tensor([5, seq[0, p].item()])  # slot 0 is a bystander at position 0
        pos = torch.tensor([0, p])
        logits = model.decode(tokens, pos, cache, kv_len=32)
        torch.testing.assert_close(logits[1], full[p], atol=1e-5, rtol=1e-5)


def test_unknown_weight_name_and_shape_mismatch_are_rejected(tmp_path):
    _, config = save_tiny_model("qwen2", tmp_path)
    weights = WeightStore(model_spec(config), torch.float32, torch.device("cpu"))
    weights.allocate()
    with pytest.raises(KeyError, match=r"unknown weight 'model.layers.0.self_attn.q_prj.weight'.*q_proj"):
        weights.copy_named([("model.layers.0.self_attn.q_prj.weight", torch.zeros(64, 64))])
    with pytest.raises(ValueError, match=r"k_proj.weight' has shape \(64, 64\), expected \(32, 64\)"):
        weights.copy_named([("model.layers.0.self_attn.k_proj.weight", torch.zeros(64, 64))])


def test_fused_projections_receive_their_hf_slices(tmp_path):
    """k_proj lands in rows [64, 96) of the fused qkv matrix (q has 4 heads × 16 = 64 rows), up_proj in rows
    [112, 224) of gate_up; FSDP wrapper prefixes are stripped and the dtype is cast on copy."""
    _, config = save_tiny_model("qwen2", tmp_path)
    weights = WeightStore(model_spec(config), torch.float32, torch.device("cpu"))
    weights.allocate()
    k = torch.arange(32 * 64, dtype=torch.float64).view(32, 64)
    up = torch.full((112, 64), 0.5, dtype=torch.bfloat16)
    weights.copy_named([
        ("_fsdp_wrapped_module.model.layers.1.self_attn.k_proj.weight", k),
        ("model.layers.1.mlp.up_proj.weight", up),
    ])
    layer = weights.layer(1)
    assert torch.equal(layer["qkv_w"][64:96], k.float())
    assert torch.equal(layer["gate_up_w"][112:], up.float())


def test_unsupported_architecture_names_it_and_suggests_hf():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2)
    config.architectures = ["GPT2LMHeadModel"]
    with pytest.raises(ValueError, match=r"GPT2LMHeadModel.*rollout.name=hf"):
        model_spec(config)


def test_dynamic_rope_matches_hf_within_the_original_context(tmp_path):
    """Dynamic NTK only changes frequencies past max_position_embeddings; below it the tables equal HF's."""
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32, rope_scaling=dict(rope_type="dynamic", factor=2.0),
    )
    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float().eval()
    hf.save_pretrained(tmp_path)
    model = native_model(transformers.AutoConfig.from_pretrained(tmp_path), tmp_path)
    tokens = torch.randint(0, VOCAB, (2, 20), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(model.score(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)


def test_sharded_checkpoint_is_read_through_its_index(tmp_path):
    """A sharded save (index + shards) loads; a non-HF file next to it (Mistral repos ship consolidated.safetensors
    with original names) is ignored; a directory without weights is an error naming it."""
    from safetensors.torch import save_file

    from verlx.rollout.native.weights import checkpoint_files

    torch.manual_seed(0)
    hf = transformers.AutoModelForCausalLM.from_config(tiny_config("llama3"), attn_implementation="sdpa").eval()
    hf.save_pretrained(tmp_path, max_shard_size="100KB")
    save_file({"layers.0.attention.wq.weight": torch.zeros(2, 2)}, str(tmp_path / "consolidated.safetensors"))
    files = checkpoint_files(str(tmp_path))
    assert len(files) > 1 and not any("consolidated" in f for f in files)
    model = native_model(transformers.AutoConfig.from_pretrained(tmp_path), tmp_path)
    tokens = torch.randint(0, VOCAB, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        torch.testing.assert_close(model.score(tokens), hf(tokens).logits, atol=1e-5, rtol=1e-5)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=f"no model.*safetensors or pytorch_model.*bin in {empty}"):
        checkpoint_files(str(empty))
