"""megatron-core GPT chunks built from an HF checkpoint give HF's log-probs (CPU, fp32, one gloo rank).

megatron-core's pipeline schedules allocate on CUDA, so the schedule-driven paths are GPU-only
(benchmarks/megatron_parity.py); the model, the weight loading and the log-prob head run here.
"""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install 'verlx[megatron]')")


def _worker(rank: int, tmp: str) -> None:
    import torch.distributed as dist
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from verlx.config.engine import MegatronConfig
    from verlx.models.policy import PolicyModel
    from verlx.workers.megatron.architectures import model_dims
    from verlx.workers.megatron.batch_layout import align_batch
    from verlx.workers.megatron.setup import build_role_chunks, init_model_parallel, layout_for

    dist.init_process_group("gloo", init_method=f"file://{tmp}/init", rank=0, world_size=1)
    torch.manual_seed(0)
    hf = Qwen3ForCausalLM(Qwen3Config(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, head_dim=16, vocab_size=101, max_position_embeddings=64,
                                      tie_word_embeddings=True, architectures=["Qwen3ForCausalLM"]))
    hf.save_pretrained(os.path.join(tmp, "hf"))
    dims = model_dims(hf.config)
    mcfg = MegatronConfig(dtype="float32", use_transformer_engine="false")
    layout = layout_for(mcfg, 1, dims)
    init_model_parallel(layout, 1)
    chunks, _ = build_role_chunks(dims, layout, mcfg, os.path.join(tmp, "hf"), recompute=False, value_head=False)
    ids = torch.randint(0, 101, (3, 12))
    mask = torch.ones(3, 12, dtype=torch.long)
    mask[1, :3] = 0  # left padding in the prompt
    mask[2, 10:] = 0  # right padding after the response
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    aligned = align_batch(ids, mask, response_length=6)
    with torch.no_grad():
        hidden = chunks[0](aligned.input_ids)
        lp, ent = chunks[0].log_probs(hidden, aligned, 0.8, 4, True)
        spsq = chunks[0].sum_pi_squared(hidden, aligned, 0.8, 4)
        ref, ref_ent, ref_spsq = PolicyModel(hf.eval())(ids, mask, pos, response_length=6, temperature=0.8,
                                                        with_entropy=True, with_sum_pi_squared=True)
    valid = mask[:, 6:].bool()
    # what megatron's finalize_model_grads all-reduces between the first and last stage when PP > 1
    from megatron.core.distributed.finalize_model_grads import _get_shared_word_embedding_weight

    shared = _get_shared_word_embedding_weight(chunks[0], chunks[0].config)
    tied = shared is chunks[0].gpt.embedding.word_embeddings.weight
    torch.save({"dlogp": (lp - ref).abs()[valid].max(), "dent": (ent - ref_ent).abs()[valid].max(), "tied": tied,
                "dspsq": (spsq - ref_spsq).abs()[valid].max()}, os.path.join(tmp, "out.pt"))
    dist.destroy_process_group()


def test_megatron_chunk_matches_hf_log_probs():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(tmp,), nprocs=1)
        out = torch.load(os.path.join(tmp, "out.pt"))
    # Qwen3: GQA, q/k norm, head_dim 16 ≠ 64/4, tied embeddings; fp32 on CPU agrees to rounding
    assert out["dlogp"] < 1e-5 and out["dent"] < 1e-5 and out["dspsq"] < 1e-6
    assert out["tied"]  # the chunk exposes its tied embedding to megatron's gradient finalisation
