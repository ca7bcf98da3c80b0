"""HF ⇄ megatron weight conversion: layouts by hand, bitwise round trips, placement, config mapping, bad input."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from verlx.workers.megatron.architectures import gpt_model_kwargs, model_dims, transformer_config_kwargs
from verlx.workers.megatron.batch_layout import align_batch
from verlx.workers.megatron.parallel import ParallelLayout, check_layout, require_layout
from verlx.workers.megatron.weight_layout import (
    GLU,
    fuse_qkv,
    hf_to_megatron,
    layer_placement,
    local_spec_name,
    megatron_to_hf,
    split_qkv,
    te_name,
    tp_merge,
    tp_shard,
)

SMALL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=50, max_position_embeddings=64)


def hf_model(kind: str, tie: bool):
    torch.manual_seed(0)
    if kind == "qwen2":
        return Qwen2ForCausalLM(Qwen2Config(**SMALL, tie_word_embeddings=tie))
    if kind == "qwen3":
        return Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=16, tie_word_embeddings=tie))
    return LlamaForCausalLM(LlamaConfig(**SMALL, tie_word_embeddings=tie))


def test_qkv_fusion_by_hand():
    # 4 query heads in 2 groups, head_dim 1, hidden 1: q=[0,1,2,3], k=[10,11], v=[20,21]
    # per group g: its 2 query heads, k_g, v_g  →  [0,1,10,20, 2,3,11,21]; TP=2 gives each rank one whole group
    dims = model_dims(Qwen2Config(hidden_size=4, intermediate_size=4, num_hidden_layers=1, num_attention_heads=4,
                                  num_key_value_heads=2, head_dim=1, vocab_size=8))
    q, k, v = torch.tensor([[0.], [1.], [2.], [3.]]), torch.tensor([[10.], [11.]]), torch.tensor([[20.], [21.]])
    fused = fuse_qkv(q, k, v, dims)
    assert fused.flatten().tolist() == [0, 1, 10, 20, 2, 3, 11, 21]
    assert tp_shard("column", fused, 2, 1).flatten().tolist() == [2, 3, 11, 21]
    back = split_qkv(fused, dims)
    assert [t.flatten().tolist() for t in back] == [[0, 1, 2, 3], [10, 11], [20, 21]]
    bias = fuse_qkv(q.flatten(), k.flatten(), v.flatten(), dims)  # biases use the same layout
    assert bias.tolist() == [0, 1, 10, 20, 2, 3, 11, 21]


def test_glu_tp_layout_by_hand():
    # fc1 = [gate; up] = [g0 g1 g2 g3 u0 u1 u2 u3]; TP=2 rank r holds [gate_r; up_r]
    merged = torch.tensor([0., 1., 2., 3., 10., 11., 12., 13.]).unsqueeze(1)
    shards = [tp_shard(GLU, merged, 2, r) for r in range(2)]
    assert [s.flatten().tolist() for s in shards] == [[0, 1, 10, 11], [2, 3, 12, 13]]
    assert torch.equal(tp_merge(GLU, shards), merged)


def test_interleaved_pipeline_placement():
    # 8 layers, PP 2, VPP 2 → 2 layers per chunk; block b = chunk·pp + stage holds layers [2b, 2b+2)
    layout = ParallelLayout(2, 1, 2, 1, 2)
    got = [(p.pp_rank, p.chunk, p.local_layer) for p in (layer_placement(i, 8, layout) for i in range(8))]
    assert got == [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1), (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)]


@pytest.mark.parametrize("layers,pp,first,last", [(8, 2, None, None), (8, 2, 1, None), (8, 2, None, 3),
                                                  (61, 4, 13, 12), (27, 4, None, 6), (10, 3, 2, 2), (7, 2, 3, 4)])
def test_uneven_pipeline_placement_is_megatrons(layers, pp, first, last):
    """The stages' layer counts and each layer's stage and local index are megatron-core's own
    (get_num_layers_to_build, get_transformer_layer_offset) for num_layers_in_first/last_pipeline_stage; the 61-layer
    case is veRL's DeepSeek-V3 script's split shape."""
    from types import SimpleNamespace

    block = pytest.importorskip("megatron.core.transformer.transformer_block")
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    config = SimpleNamespace(num_layers=layers, pipeline_model_parallel_size=pp,
                             num_layers_in_first_pipeline_stage=first, num_layers_in_last_pipeline_stage=last,
                             pipeline_model_parallel_layout=None, account_for_embedding_in_pipeline_split=False,
                             account_for_loss_in_pipeline_split=False, virtual_pipeline_model_parallel_size=None)
    layout = ParallelLayout(pp, 1, pp, first_stage_layers=first, last_stage_layers=last)
    counts = [block.get_num_layers_to_build(config, pp_rank=r) for r in range(pp)]
    assert layout.stage_layers(layers) == counts
    want = [(r, 0, i - get_transformer_layer_offset(config, pp_rank=r))
            for r in range(pp) for i in range(get_transformer_layer_offset(config, pp_rank=r),
                                              get_transformer_layer_offset(config, pp_rank=r) + counts[r])]
    assert [(p.pp_rank, p.chunk, p.local_layer) for p in (layer_placement(i, layers, layout)
                                                          for i in range(layers))] == want


def test_uneven_pipeline_weights_round_trip_and_land_on_their_stage():
    model = hf_model("qwen2", False)  # 4 layers: stage 0 holds layer 0, stage 1 layers 1-3
    dims, hf = model_dims(model.config), {k: v.clone() for k, v in model.state_dict().items()}
    layout = ParallelLayout(4, 2, 2, first_stage_layers=1)
    shards = {(t, p, 0): hf_to_megatron(hf, dims, layout, t, p) for t in range(2) for p in range(2)}
    back = megatron_to_hf(shards, dims, layout)
    assert set(back) == set(hf) and all(torch.equal(back[k], hf[k]) for k in hf)
    first, last = shards[(0, 0, 0)][0], shards[(0, 1, 0)][0]
    assert {n.split(".")[2] for n in first if n.startswith("decoder.layers.")} == {"0"}
    assert {n.split(".")[2] for n in last if n.startswith("decoder.layers.")} == {"0", "1", "2"}
    half = hf["model.layers.3.input_layernorm.weight"]
    assert torch.equal(last["decoder.layers.2.input_layernorm.weight"], half)  # global layer 3 is stage 1's third


@pytest.mark.parametrize("sizes,message", [
    (dict(pp=2, first_stage_layers=3, last_stage_layers=2), "num_hidden_layers=4 do not fit: 4 layers leave -1"),
    (dict(pp=3, first_stage_layers=1), "num_hidden_layers=4 do not fit: 4 layers leave 3 for the 2 other"),
    (dict(pp=1, first_stage_layers=2), "needs pipeline_model_parallel_size >= 2 (got 1)"),
    (dict(pp=2, vpp=2, first_stage_layers=1), "only without virtual pipeline stages"),
    (dict(pp=2, first_stage_layers=0), "every pipeline stage needs at least one layer"),
    (dict(pp=2, first_stage_layers=4), "leave a pipeline stage without layers"),
])
def test_an_uneven_split_that_megatron_cannot_build_is_named(sizes, message):
    pp = sizes.pop("pp")
    problems = check_layout(4, 1, pp, 1, sizes.pop("vpp", None), num_layers=4, key="actor_rollout_ref.actor.megatron",
                            **sizes)
    assert any(message in p and "override_transformer_config.num_layers_in_" in p for p in problems), problems
    assert not check_layout(4, 1, 2, num_layers=5, first_stage_layers=2, key="k")  # 5 layers: 2 + 3


@pytest.mark.parametrize("kind", ["qwen2", "qwen3", "llama"])
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("tp,pp,vpp", [(1, 1, None), (2, 1, None), (2, 2, None), (1, 2, 2)])
def test_round_trip_is_bitwise_exact(kind, tie, tp, pp, vpp):
    model = hf_model(kind, tie)
    dims = model_dims(model.config)
    hf = {k: v.clone() for k, v in model.state_dict().items()}
    layout = ParallelLayout(tp * pp, tp, pp, 1, vpp)
    shards = {(t, p, 0): hf_to_megatron(hf, dims, layout, t, p) for t in range(tp) for p in range(pp)}
    back = megatron_to_hf(shards, dims, layout)
    expected = {k for k in hf if not (tie and k == "lm_head.weight")}
    assert set(back) == expected
    for name in expected:
        assert torch.equal(back[name], hf[name]), name
    # vocab 50 is padded to a multiple of TP: every rank holds ceil(50 / tp) rows
    emb = shards[(0, 0, 0)][0]["embedding.word_embeddings.weight"]
    assert emb.shape == (-(-50 // tp), 32)
    last = shards[(0, pp - 1, 0)][-1]
    assert ("output_layer.weight" in last) == (not tie or pp > 1)


def test_megatron_shapes_per_rank():
    dims = model_dims(hf_model("qwen3", False).config)  # head_dim 16 ≠ hidden/heads
    layout = ParallelLayout(4, 2, 2)
    shard = hf_to_megatron(hf_model("qwen3", False).state_dict(), dims, layout, tp_rank=1, pp_rank=1)[0]
    # stage 1 holds global layers 2,3 as local 0,1; qkv rows per rank: (2 groups / 2) × (2 q + k + v) × 16 = 64
    assert shard["decoder.layers.1.self_attention.linear_qkv.weight"].shape == (64, 32)
    assert shard["decoder.layers.0.self_attention.linear_proj.weight"].shape == (32, 32)  # 4 heads×16 / 2
    assert shard["decoder.layers.0.mlp.linear_fc1.weight"].shape == (48, 32)  # 2×48 / 2
    assert shard["decoder.layers.0.self_attention.q_layernorm.weight"].shape == (16,)
    assert "decoder.layers.2.input_layernorm.weight" not in shard
    assert "embedding.word_embeddings.weight" not in shard and "decoder.final_layernorm.weight" in shard


def test_te_names_round_trip():
    name = "decoder.layers.3.input_layernorm.weight"
    assert te_name(name) == "decoder.layers.3.self_attention.linear_qkv.layer_norm_weight"
    assert local_spec_name(te_name(name)) == name
    assert te_name("decoder.layers.0.mlp.linear_fc2.weight") == "decoder.layers.0.mlp.linear_fc2.weight"


def test_transformer_config_mapping():
    cfg = Qwen3Config(**SMALL, head_dim=16, rms_norm_eps=1e-5, rope_theta=1e6)
    dims = model_dims(cfg)
    kw = transformer_config_kwargs(dims, tp=2, pp=2, sequence_parallel=True)
    shape = (kw["num_attention_heads"], kw["num_query_groups"], kw["kv_channels"], kw["ffn_hidden_size"])
    assert shape == (4, 2, 16, 48)
    assert kw["qk_layernorm"] and not kw["add_qkv_bias"] and kw["gated_linear_unit"] and kw["sequence_parallel"]
    assert kw["layernorm_epsilon"] == 1e-5 and kw["normalization"] == "RMSNorm" and kw["params_dtype"] == torch.bfloat16
    assert not transformer_config_kwargs(dims, tp=1, sequence_parallel=True)["sequence_parallel"]
    g = gpt_model_kwargs(dims, tp=4)
    assert g["vocab_size"] == 52 and g["rotary_base"] == 1e6 and not g["share_embeddings_and_output_weights"]
    assert model_dims(Qwen2Config(**SMALL)).qkv_bias and not model_dims(LlamaConfig(**SMALL)).qkv_bias
    llama3 = LlamaConfig(**{**SMALL, "max_position_embeddings": 16384}, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192, "rope_theta": 5e5})
    g = gpt_model_kwargs(model_dims(llama3))
    assert g["rope_scaling"] and g["rope_scaling_factor"] == 8.0 and g["rotary_base"] == 5e5


def test_unsupported_architecture_lists_supported():
    cfg = Qwen2Config(**SMALL)
    cfg.architectures = ["MistralForCausalLM"]
    with pytest.raises(KeyError, match="MistralForCausalLM.*LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"):
        model_dims(cfg)
    yarn = Qwen2Config(**SMALL, rope_scaling={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4,
                                              "original_max_position_embeddings": 32})
    with pytest.raises(ValueError, match="yarn"):
        model_dims(yarn)


def test_parallel_sizes_that_do_not_divide():
    problems = check_layout(8, tp=3, pp=2, num_heads=4, num_kv_heads=2, num_layers=6)
    text = "\n".join(problems)
    assert "3×2×1 = 6 does not divide the world size 8" in text
    assert "tensor_model_parallel_size=3 does not divide the model's num_attention_heads=4" in text
    assert "num_key_value_heads=2" in text
    layers = check_layout(8, tp=2, pp=4, vpp=2, num_heads=4, num_kv_heads=2, num_layers=12)
    assert layers == ["megatron: the model's num_hidden_layers=12 do not split evenly into "
                      "pipeline_model_parallel_size × virtual_pipeline_model_parallel_size = 4×2 = 8 model chunks"]
    assert "needs pipeline_model_parallel_size >= 2" in check_layout(2, 1, 1, vpp=2)[0]
    with pytest.raises(ValueError, match="invalid megatron parallel layout"):
        require_layout(6, 4, 1)
    layout = require_layout(8, 2, 2)
    # rank = tp + TP·(cp + CP·(dp + DP·pp)): rank 5 = tp 1, dp 0, pp 1 with TP 2, DP 2
    assert layout.dp == 2 and layout.coords(5) == {"tp": 1, "cp": 0, "dp": 0, "pp": 1}


def test_align_batch_maps_response_positions():
    # prompt width 4 (left-padded), response width 3 (right-padded); row 0 has 2 pads, row 1 none
    ids = torch.tensor([[0, 0, 5, 6, 7, 8, 0],
                        [1, 2, 3, 4, 9, 0, 0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 0],
                         [1, 1, 1, 1, 1, 0, 0]])
    a = align_batch(ids, mask, response_length=3, multiple_of=4)
    # longest real run is 5 tokens → width rounded up to 8; row 0 shifted left by 2
    assert a.input_ids.shape == (2, 8)
    assert a.input_ids[0, :4].tolist() == [5, 6, 7, 8] and a.input_ids[1, :5].tolist() == [1, 2, 3, 4, 9]
    # response token j of row 0 sits at aligned 2 + j and is predicted from aligned 1 + j
    assert a.hidden_index.tolist() == [[1, 2, 3], [3, 4, 5]]
    assert a.targets.tolist() == [[7, 8, 0], [9, 0, 0]]
    with pytest.raises(ValueError, match="row 0 .* contiguous"):
        align_batch(ids, torch.tensor([[1, 0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0, 0]]), 3)


def moe_checkpoint(tmp_path) -> dict[str, torch.Tensor]:
    """A Qwen3-MoE's tensors as its checkpoint stores them (one tensor per expert and projection)."""
    from safetensors.torch import load_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(**{**SMALL, "num_hidden_layers": 2}, head_dim=16, moe_intermediate_size=24,
                            num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, tie_word_embeddings=False)
    Qwen3MoeForCausalLM(config).save_pretrained(tmp_path)
    return load_file(str(tmp_path / "model.safetensors")), config


@pytest.mark.parametrize("tp,pp,ep", [(1, 1, 1), (2, 1, 2), (1, 2, 2), (2, 2, 1), (1, 1, 4)])
def test_mixture_of_experts_round_trip_and_expert_placement(tmp_path, tp, pp, ep):
    hf, config = moe_checkpoint(tmp_path)
    dims = model_dims(config)
    assert (dims.num_experts, dims.moe_topk, dims.moe_ffn_hidden_size, dims.moe_renormalize) == (4, 2, 24, True)
    layout = ParallelLayout(tp * pp * ep, tp, pp, 1, None, ep)
    shards = {(t, p, e): hf_to_megatron(hf, dims, layout, t, p, e) for t in range(tp) for p in range(pp)
              for e in range(ep)}
    back = megatron_to_hf(shards, dims, layout)
    assert set(back) == set(hf)
    assert all(torch.equal(back[name], hf[name]) for name in hf)
    # expert-parallel rank e holds experts [e·4/ep, (e+1)·4/ep) as local experts 0..4/ep-1
    last = shards[(0, 0, ep - 1)][0]
    local = sorted(k for k in last if ".mlp.experts." in k and k.startswith("decoder.layers.0.") and "fc2" in k)
    assert local == [f"decoder.layers.0.mlp.experts.local_experts.{i}.linear_fc2.weight" for i in range(4 // ep)]
    top = hf[f"model.layers.0.mlp.experts.{4 - 4 // ep}.down_proj.weight"]  # the rank's first expert
    assert torch.equal(last["decoder.layers.0.mlp.experts.local_experts.0.linear_fc2.weight"],
                       torch.chunk(top, tp, dim=1)[0])
    assert last["decoder.layers.0.mlp.router.weight"].shape == (4, 32)


def test_mixture_of_experts_transformer_config():
    from transformers import Qwen3MoeConfig

    dims = model_dims(Qwen3MoeConfig(**SMALL, head_dim=16, moe_intermediate_size=24, num_experts=4,
                                     num_experts_per_tok=2, norm_topk_prob=False))
    kwargs = transformer_config_kwargs(dims, tp=2, ep=2, etp=1)
    assert (kwargs["num_moe_experts"], kwargs["moe_router_topk"], kwargs["moe_ffn_hidden_size"]) == (4, 2, 24)
    assert kwargs["moe_router_pre_softmax"] is True  # no renormalisation: top-k of the full softmax, as HF
    assert (kwargs["expert_model_parallel_size"], kwargs["expert_tensor_parallel_size"]) == (2, 1)
    assert kwargs["moe_router_load_balancing_type"] == "none" and kwargs["moe_token_dispatcher_type"] == "alltoall"
    with pytest.raises(ValueError, match="every layer is a mixture of experts"):
        model_dims(Qwen3MoeConfig(**SMALL, num_experts=4, mlp_only_layers=[0]))
