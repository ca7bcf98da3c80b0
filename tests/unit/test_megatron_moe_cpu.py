"""A Qwen3 mixture-of-experts model on the megatron engine, 2 gloo processes on the CPU (fp32): expert parallel
(EP=2: each rank holds half the experts, tokens travel by all-to-all), tensor parallel with the experts split too
(TP=2, ETP=2, sequence parallel) and TP=2 with EP=2 over the tensor-parallel ranks (ETP=1) all give HF's log-probs,
stream every expert's weights to the rollout engine in HF's checkpoint names, and after one update agree with plain
data parallelism on the loss, the gradient norm and the new log-probs."""

from __future__ import annotations

import os
import tempfile

import pytest
import torch
import torch.multiprocessing as mp

from helpers.ppo_batches import ragged_ppo_batch

pytest.importorskip("megatron.core", reason="megatron-core is not installed (pip install 'verlx[megatron]')")

LAYOUTS = {"dp2": dict(), "ep2": dict(expert_model_parallel_size=2),
           "tp2": dict(tensor_model_parallel_size=2),
           "tp2_ep2": dict(tensor_model_parallel_size=2, expert_model_parallel_size=2, expert_tensor_parallel_size=1)}


def _save_model(path: str) -> None:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(hidden_size=32, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=40, num_experts=4,
                            num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=64,
                            tie_word_embeddings=False, architectures=["Qwen3MoeForCausalLM"])
    Qwen3MoeForCausalLM(config).save_pretrained(path)


def _hf_log_probs(path: str, data) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    from verlx.models.policy import PolicyModel

    model = PolicyModel(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
    with torch.no_grad():
        log_probs, _ = model(data.batch["input_ids"], data.batch["attention_mask"], data.batch["position_ids"],
                             response_length=data.batch["responses"].shape[1])
    return log_probs


def _run_layout(path: str, name: str, data) -> dict:
    from megatron.core import parallel_state as mpu
    from safetensors.torch import load_file

    from verlx.config.engine import MegatronConfig, ModelConfig
    from verlx.config.roles import ActorConfig
    from verlx.models.hf_config import load_hf_config
    from verlx.workers.actor import PPOActor
    from verlx.workers.engine import ModelSpec
    from verlx.workers.megatron.engine import MegatronEngine

    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    cfg = ActorConfig(strategy="megatron", grad_clip=0.0, ppo_micro_batch_size_per_gpu=4)
    cfg.optim.lr, cfg.optim.weight_decay = 1e-3, 0.0
    cfg.megatron = MegatronConfig(dtype="float32", use_transformer_engine="false", use_distributed_optimizer=False,
                                  **LAYOUTS[name])
    hf_config = load_hf_config(path, False, {})
    placement = MegatronEngine.place({"actor_rollout_ref.actor": cfg}, hf_config, 2)
    engine = MegatronEngine.build(ModelSpec("actor", path, ModelConfig(path=path), cfg, hf_config,
                                            torch.device("cpu")), placement)
    local_experts = sum(".local_experts." in n and "layers.0.mlp" in n and "fc2" in n
                        for c in engine.chunks for n, _ in c.named_parameters())
    checkpoint = load_file(os.path.join(path, "model.safetensors"))
    streamed = dict(engine.rollout_weights(torch.float32))
    stream_ok = set(streamed) == set(checkpoint) and all(torch.equal(streamed[k], checkpoint[k]) for k in checkpoint)
    actor = PPOActor(cfg, engine)
    before = actor.compute_log_prob(data, 4, False, 0)[0]
    metrics = actor.update_policy(data, len(data), 4)
    after = actor.compute_log_prob(data, 4, False, 0)[0]
    return {"before": before, "after": after, "pg_loss": metrics.get("actor/pg_loss"),
            "grad_norm": metrics.get("actor/grad_norm"), "local_experts": local_experts, "stream_ok": stream_ok,
            "export_ok": _export_matches_stream(engine, path, name)}


def _export_matches_stream(engine, path: str, name: str) -> bool:
    """The dist-checkpoint of the updated weights, exported to HF on one rank (what verlx.model_merger does), holds
    the tensors the rollout stream sends."""
    import torch.distributed as dist

    from verlx.workers.megatron.checkpoint import export_megatron_checkpoint

    streamed = dict(engine.rollout_weights(torch.float32))
    engine.save_checkpoint(os.path.join(path, "..", name, "actor"))
    if dist.get_rank() != 0:
        return True
    from safetensors.torch import load_file
    from transformers import AutoConfig

    ckpt, out = os.path.join(path, "..", name, "actor"), os.path.join(path, "..", name, "exported")
    AutoConfig.from_pretrained(path).save_pretrained(os.path.join(ckpt, "huggingface"))  # the worker writes it
    export_megatron_checkpoint(ckpt, out, dtype=torch.float32)
    exported = load_file(os.path.join(out, "model.safetensors"))
    return set(exported) == set(streamed) and all(torch.equal(exported[k], streamed[k]) for k in streamed)


def _worker(rank: int, tmp: str) -> None:
    from helpers.megatron_cpu import two_gloo_ranks_with_model

    with two_gloo_ranks_with_model(rank, tmp, _save_model) as path:
        data = ragged_ppo_batch(0, rows=8, token_range=(3, 40), meta_info={"temperature": 1.0})
        out = {"hf": _hf_log_probs(path, data)}
        for name in LAYOUTS:
            out[name] = _run_layout(path, name, data)
        torch.save(out, os.path.join(tmp, f"rank{rank}.pt"))


def test_expert_and_tensor_parallel_moe_match_hf_and_data_parallel():
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_worker, args=(tmp,), nprocs=2)
        results = [torch.load(os.path.join(tmp, f"rank{r}.pt")) for r in range(2)]
    last = results[1]  # rows are the same on both ranks; rank 1 is the last pipeline stage in every layout
    mask = ragged_ppo_batch(0, rows=8, token_range=(3, 40)).batch["response_mask"].bool()
    reference = last["dp2"]
    assert (last["hf"] - reference["before"]).abs()[mask].max() < 1e-5
    assert (reference["after"] - reference["before"]).abs()[mask].max() > 1e-3  # the update moved the policy
    assert [r[name]["local_experts"] for r in results for name in LAYOUTS] == [4, 2, 4, 2] * 2
    for name in LAYOUTS:
        run = last[name]
        assert all(r[name]["stream_ok"] and r[name]["export_ok"] for r in results), name
        assert (run["before"] - last["hf"]).abs()[mask].max() < 1e-5, name
        assert run["pg_loss"] == pytest.approx(reference["pg_loss"], abs=1e-6), name
        assert run["grad_norm"] == pytest.approx(reference["grad_norm"], rel=1e-5), name
        assert (run["after"] - reference["after"]).abs()[mask].max() < 1e-5, name
