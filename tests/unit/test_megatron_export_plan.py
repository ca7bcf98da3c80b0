"""The rollout export plan (names, shapes, owners, TP concat) and its streaming iterator over real gloo groups."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

from verlx.workers.megatron.architectures import model_dims
from verlx.workers.megatron.export_plan import ExportGroups, export_plan, iter_hf_weights
from verlx.workers.megatron.parallel import ParallelLayout
from verlx.workers.megatron.weight_layout import hf_to_megatron

SMALL = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
             vocab_size=50, max_position_embeddings=64)
BUILDERS = {
    "qwen2": lambda tie: Qwen2ForCausalLM(Qwen2Config(**SMALL, tie_word_embeddings=tie)),
    "qwen3": lambda tie: Qwen3ForCausalLM(Qwen3Config(**SMALL, head_dim=8, tie_word_embeddings=tie)),
    "llama": lambda tie: LlamaForCausalLM(LlamaConfig(**SMALL, tie_word_embeddings=tie)),
}


@pytest.mark.parametrize("kind", sorted(BUILDERS))
@pytest.mark.parametrize("tie", [False, True])
@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("pp", [1, 2])
def test_plan_names_shapes_owners(kind, tie, tp, pp):
    torch.manual_seed(0)
    model = BUILDERS[kind](tie)
    hf_shapes = {k: tuple(v.shape) for k, v in model.state_dict().items() if not (tie and k == "lm_head.weight")}
    dims = model_dims(model.config)
    plan = export_plan(dims, ParallelLayout(tp * pp, tp, pp))
    planned = {name: shape for e in plan for name, shape in e.hf}
    assert planned == hf_shapes  # every HF tensor exactly once, with its HF shape (vocab padding removed)
    owner = {name: e.pp_rank for e in plan for name, _ in e.hf}
    per_stage = 4 // pp
    for i in range(4):
        assert owner[f"model.layers.{i}.mlp.down_proj.weight"] == i // per_stage
    assert owner["model.embed_tokens.weight"] == 0 and owner["model.norm.weight"] == pp - 1
    if not tie:
        assert owner["lm_head.weight"] == pp - 1
    concat = {e.spec.hf_names[0]: e.tp_split for e in plan}
    assert concat["model.layers.0.self_attn.q_proj.weight"] == "column"
    assert concat["model.layers.0.self_attn.o_proj.weight"] == "row"
    assert concat["model.layers.0.mlp.gate_proj.weight"] == "glu"
    assert concat["model.embed_tokens.weight"] == "vocab"
    assert concat["model.layers.0.input_layernorm.weight"] == "replicated"
    emb = next(e for e in plan if e.spec.hf_names[0] == "model.embed_tokens.weight")
    assert emb.merged_shape == (-(-50 // tp) * tp, 32)


def _stream_worker(rank: int, world: int, init_file: str, tp: int, pp: int, out_dir: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = BUILDERS["qwen2"](False)
    hf = model.state_dict()
    dims = model_dims(model.config)
    layout = ParallelLayout(world, tp, pp)
    tp_rank, pp_rank = rank % tp, rank // tp
    # groups the way megatron builds them for tp-dp-pp with dp = 1
    tp_groups = [dist.new_group([p * tp + t for t in range(tp)]) for p in range(pp)]
    pp_groups = [dist.new_group([p * tp + t for p in range(pp)]) for t in range(tp)]
    shards = hf_to_megatron(hf, dims, layout, tp_rank, pp_rank)
    groups = ExportGroups(pp_rank, tp_groups[pp_rank], pp_groups[tp_rank])
    stream = list(iter_hf_weights(export_plan(dims, layout), dims, shards, groups, torch.float32,
                                  torch.device("cpu")))
    names = [n for n, _ in stream]
    ok = len(names) == len(set(names)) == len(hf) and all(torch.equal(t, hf[n]) for n, t in stream)
    torch.save({"ok": ok, "names": names}, os.path.join(out_dir, f"rank{rank}.pt"))
    dist.destroy_process_group()


def test_streaming_iterator_gives_every_rank_the_same_full_tensors():
    tp, pp = 2, 2
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_stream_worker, args=(tp * pp, os.path.join(tmp, "init"), tp, pp, tmp), nprocs=tp * pp)
        results = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(tp * pp)]
    assert all(r["ok"] for r in results)
    assert all(r["names"] == results[0]["names"] for r in results)  # one stream order on every rank
