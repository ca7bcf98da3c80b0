"""Megatron backend parity on 2 GPUs: `torchrun --nproc_per_node=2 benchmarks/megatron_parity.py`.

Builds a random Qwen2-shaped HF checkpoint (hidden 1024, 8 layers), then checks on the same weights:
  1. TP=2 megatron log-probs == the FSDP actor's model (PolicyModel, bf16) log-probs
  2. PP=2 likewise
  3. one GRPO-style update at PP=2 and at TP=2 (loss finite, every weight of this rank changes)
  4. dist-checkpoint → export_megatron_checkpoint → from_pretrained gives the megatron log-probs
Prints timings and a table; writes $OUT/megatron_parity.json when OUT is set.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from verlx.config.engine import MegatronConfig  # noqa: E402
from verlx.config.roles import ActorConfig  # noqa: E402
from verlx.protocol import DataProto  # noqa: E402

B, PROMPT, RESP = 8, 64, 64
TOL = 0.08  # bf16: mean |Δ log-prob| bound


def make_checkpoint(path: str) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM  # noqa: F401

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
                      num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048, tie_word_embeddings=False,
                      torch_dtype="bfloat16")
    cfg.architectures = ["Qwen2ForCausalLM"]
    model = Qwen2ForCausalLM(cfg).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)


def make_batch(vocab: int) -> DataProto:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, vocab, (B, PROMPT + RESP), generator=g)
    mask = torch.ones(B, PROMPT + RESP, dtype=torch.long)
    pads = torch.arange(B) * 5  # left padding per row
    resp_len = RESP - torch.arange(B) * 3  # right padding per row
    cols = torch.arange(PROMPT + RESP)
    mask[cols.unsqueeze(0) < pads.unsqueeze(1)] = 0
    mask[cols.unsqueeze(0) >= PROMPT + resp_len.unsqueeze(1)] = 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, PROMPT:],
                      "response_mask": mask[:, PROMPT:]}, meta_info={"temperature": 1.0})


def reference_log_probs(path: str, batch: DataProto) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    from verlx.models.policy import PolicyModel

    model = PolicyModel(AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                             attn_implementation="sdpa")).cuda().eval()
    with torch.no_grad():
        lp, _ = model(**{k: batch.batch[k].cuda() for k in ("input_ids", "attention_mask", "position_ids")},
                      response_length=RESP)
    del model
    return lp.float().cpu()


def megatron_actor(path: str, tp: int, pp: int, train: bool):
    from megatron.core import parallel_state as mpu
    from transformers import AutoConfig

    from verlx.workers.actor import PPOActor
    from verlx.workers.megatron.architectures import model_dims
    from verlx.workers.megatron.engine import MegatronEngine
    from verlx.workers.megatron.runner import MegatronRunner
    from verlx.workers.megatron.setup import build_role_chunks, init_model_parallel, layout_for, wrap_for_training

    if mpu.model_parallel_is_initialized():
        mpu.destroy_model_parallel()
    dims = model_dims(AutoConfig.from_pretrained(path))
    mcfg = MegatronConfig(tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp)
    layout = layout_for(mcfg, dist.get_world_size(), dims)
    init_model_parallel(layout, 42)
    chunks, config = build_role_chunks(dims, layout, mcfg, path, recompute=False, value_head=False)
    actor_cfg = ActorConfig(ppo_mini_batch_size=B, ppo_micro_batch_size_per_gpu=4)
    actor_cfg.optim.lr = 1e-4
    optimizer = None
    runnable = chunks
    if train:
        runnable, optimizer = wrap_for_training(chunks, config, mcfg, actor_cfg.optim, actor_cfg.grad_clip)
    runner = MegatronRunner(runnable, torch.device("cuda", torch.cuda.current_device()), optimizer)
    return PPOActor(actor_cfg, MegatronEngine(runner, dims, layout, chunks)), chunks, runnable, optimizer, layout, dims


def gathered_log_probs(actor, batch: DataProto) -> torch.Tensor:
    """The last pipeline stage's result, broadcast so rank 0 can compare (ranks are tp-fastest: last = world-1)."""
    from megatron.core import parallel_state as mpu

    lp, _ = actor.compute_log_prob(batch, 4, False, 0)
    lp = lp.float().cuda().contiguous()
    dist.broadcast(lp, src=dist.get_world_size() - 1 if mpu.get_pipeline_model_parallel_world_size() > 1 else 0)
    return lp.cpu()


def report(out: dict, rank: int, name: str, result: dict) -> None:
    """Record a check and print it at once (rank 0), so a later failure does not hide the earlier results."""
    out["checks"][name] = result
    if rank == 0:
        print("CHECK " + name + " " + json.dumps(result), flush=True)


def main() -> None:
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank % torch.cuda.device_count())
    out: dict = {"checks": {}, "timings_s": {}}
    root = tempfile.mkdtemp(prefix="megatron_parity_") if rank == 0 else None
    holder = [root]
    dist.broadcast_object_list(holder, src=0)
    root = holder[0]
    path = os.path.join(root, "hf")
    if rank == 0:
        make_checkpoint(path)
    dist.barrier()
    batch = make_batch(32000)
    mask = batch.batch["response_mask"].bool()
    t = time.perf_counter()
    ref = reference_log_probs(path, batch)
    out["timings_s"]["fsdp_model_logprob"] = time.perf_counter() - t

    for name, tp, pp in (("tp2", 2, 1), ("pp2", 1, 2)):
        actor, *_ = megatron_actor(path, tp, pp, train=False)
        t = time.perf_counter()
        lp = gathered_log_probs(actor, batch)
        out["timings_s"][f"{name}_logprob"] = time.perf_counter() - t
        diff = (lp - ref).abs()[mask]
        mean_diff = float(diff.mean())
        report(out, rank, f"{name}_logprob_parity", {"mean_abs_diff": mean_diff, "max_abs_diff": float(diff.max()),
                                                      "ok": mean_diff < TOL})

    advantages = torch.randn(B, RESP, generator=torch.Generator().manual_seed(2))
    data = batch.union(DataProto({"old_log_probs": ref, "advantages": advantages}))
    for name, tp, pp in (("pp2", 1, 2), ("tp2", 2, 1)):  # tp2 last: its trained weights are checkpointed below
        actor, chunks, wrapped, optimizer, layout, dims = megatron_actor(path, tp, pp, train=True)
        before = {n: p.detach().clone() for n, p in chunks[0].named_parameters()}
        t = time.perf_counter()
        metrics = actor.update_policy(data, B, 4)
        out["timings_s"][f"{name}_update"] = time.perf_counter() - t
        holder = [metrics]  # metrics live on the last pipeline stage (the last rank in both layouts)
        dist.broadcast_object_list(holder, src=dist.get_world_size() - 1)
        metrics = holder[0]
        changed = sum(not torch.equal(before[n], p.detach()) for n, p in chunks[0].named_parameters())
        loss = metrics.get("actor/pg_loss", float("nan"))
        ok = bool(torch.isfinite(torch.tensor(loss))) and changed == len(before)
        report(out, rank, f"{name}_grpo_update", {"pg_loss": loss, "grad_norm": metrics.get("actor/grad_norm"),
                                                  "params_changed": changed, "params": len(before), "ok": ok,
                                                  "seconds": out["timings_s"][f"{name}_update"]})

    from transformers import AutoConfig

    from verlx.workers.megatron.checkpoint import MegatronCheckpointManager, export_megatron_checkpoint

    after = gathered_log_probs(actor, batch)
    ckpt = os.path.join(root, "ckpt", "actor")
    t = time.perf_counter()
    MegatronCheckpointManager(wrapped, optimizer, None, None, AutoConfig.from_pretrained(path)).save(ckpt)
    out["timings_s"]["dist_checkpoint_save"] = time.perf_counter() - t
    if rank == 0:
        t = time.perf_counter()
        export_megatron_checkpoint(ckpt, os.path.join(root, "exported"))
        out["timings_s"]["export_to_hf"] = time.perf_counter() - t
        exported = reference_log_probs(os.path.join(root, "exported"), batch)
        diff = (exported - after).abs()[mask]
        report(out, rank, "export_parity", {"mean_abs_diff": float(diff.mean()), "max_abs_diff": float(diff.max()),
                                            "ok": float(diff.mean()) < TOL})
        print(f"{'check':<22} {'ok':<5} details")
        for name, res in out["checks"].items():
            details = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in res.items()
                                if k != "ok")
            print(f"{name:<22} {str(res['ok']):<5} {details}")
        for name, sec in out["timings_s"].items():
            print(f"timing {name:<24} {sec:8.3f} s")
        if os.environ.get("OUT"):
            with open(os.path.join(os.environ["OUT"], "megatron_parity.json"), "w") as f:
                json.dump(out, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
