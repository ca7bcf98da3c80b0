"""Actor-update throughput and MFU on one GPU: remove-padding + token-budget micro-batches vs padded fixed ones.

    python benchmarks/train_throughput.py            # both shapes, ~3-5 minutes on one H100/H200

For each model shape (Qwen2.5-0.5B and 1.5B, random weights) and each mode, builds the model as the trainer
does (fp32 master weights, FSDP2 fully_shard on a 1-rank process group with bf16 compute / fp32 reduce, AdamW
foreach) and times `PPOActor.update_policy` (forward + backward + optimizer step) on the same synthetic
mini-batch: prompts of 96-128 tokens left-padded to 128, responses lognormal around ~400 tokens clipped to
[64, 1024] and right-padded to 1024 (fixed seed). Modes: padded fixed micro-batches; packed (remove-padding +
token-budget micro-batches); packed+compile (the same with actor.use_torch_compile). By default every mode holds
the same number of token slots per micro-batch (padded: rows × 1152; packed: a budget of that many real tokens);
--packed-tokens-per-micro gives the packed modes a budget of their own. MFU counts real tokens only
(verlx.utils.flops, veRL's convention) against the device's peak dense bf16 TFLOP/s.

Then the peak memory of log-probs + entropy for 16 × 1024 = 16k tokens of the 0.5B model (151,936 vocabulary):
the packed model with chunked log-softmax vs the HF forward that materialises full logits.

Prints a table; writes $OUT/train_throughput.json when OUT is set.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from verlx.config.roles import ActorConfig
from verlx.protocol import DataProto

SHAPES = {
    "0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
             "intermediate_size": 4864, "tie_word_embeddings": True},
    "1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
             "intermediate_size": 8960, "tie_word_embeddings": True},
}
VOCAB, PROMPT, RESPONSE = 151936, 128, 1024
# token slots per micro-batch (padded rows × 1152 = packed budget); sized for 80 GB without checkpointing
ROWS_PER_MICRO = {"0.5b": 16, "1.5b": 8}


def qwen2_config(shape: str):
    from transformers import Qwen2Config

    return Qwen2Config(vocab_size=VOCAB, max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1e6,
                       **SHAPES[shape])


def init_single_rank() -> None:
    """A 1-rank process group, as the trainer's worker has even on one GPU (FSDP2 needs one)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from verlx.utils.distributed import init_distributed

    init_distributed()


def synthetic_batch(n: int, seed: int = 0) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    prompt_lens = torch.randint(96, PROMPT + 1, (n,), generator=g)
    response_lens = torch.exp(torch.randn(n, generator=g) * 0.7 + torch.log(torch.tensor(320.0)))
    response_lens = response_lens.round().clamp(64, RESPONSE).long()
    ids = torch.randint(0, VOCAB, (n, PROMPT + RESPONSE), generator=g)
    cols = torch.arange(PROMPT + RESPONSE)
    mask = ((cols >= PROMPT - prompt_lens[:, None]) & (cols < PROMPT + response_lens[:, None])).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    response_mask = mask[:, PROMPT:]
    old = -torch.rand(n, RESPONSE, generator=g) * 5 * response_mask
    adv = torch.randn(n, RESPONSE, generator=g) * response_mask
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, PROMPT:],
                      "response_mask": response_mask, "old_log_probs": old, "advantages": adv},
                     meta_info={"temperature": 1.0})


def build_actor(shape: str, packed: bool, cfg: ActorConfig, checkpointing: bool, compiled: bool = False):
    from transformers import Qwen2ForCausalLM

    from verlx.models.policy import PolicyModel
    from verlx.workers.actor import PPOActor
    from verlx.workers.fsdp.engine import FSDPEngine
    from verlx.workers.fsdp.model_builder import (
        apply_fsdp2,
        build_optimizer,
        compile_for_training,
        enable_activation_checkpointing,
    )

    device = torch.device("cuda")
    torch.manual_seed(0)
    hf_config = qwen2_config(shape)
    hf_config._attn_implementation = "sdpa"
    with device:
        hf = Qwen2ForCausalLM(hf_config)
    if checkpointing:
        enable_activation_checkpointing(hf)
    module = PolicyModel(hf, packed=packed)
    compile_for_training(module, compiled, device)  # what actor.use_torch_compile does in the worker
    apply_fsdp2(module, device, torch.bfloat16)
    optimizer = build_optimizer(module.parameters(), cfg.optim)
    engine = FSDPEngine("actor", module, optimizer, device, grad_clip=cfg.grad_clip,
                        defer_grad_reduce=cfg.fsdp_config.defer_grad_reduce)
    return PPOActor(cfg, engine), hf_config


def time_updates(actor, data: DataProto, mini: int, micro: int | None, warmup: int, steps: int) -> float:
    for _ in range(warmup):
        actor.update_policy(data, mini, micro)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        actor.update_policy(data, mini, micro)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / steps


def attention_kernel_name(hf_config) -> str:
    from verlx.models.attention import select_kernel

    heads, kv = hf_config.num_attention_heads, hf_config.num_key_value_heads
    head_dim = hf_config.hidden_size // heads
    q = torch.zeros(8, heads, head_dim, device="cuda", dtype=torch.bfloat16)
    k = torch.zeros(8, kv, head_dim, device="cuda", dtype=torch.bfloat16)
    return type(select_kernel(q, k, None, 0.0)).__name__


def log_prob_seconds(hf_config, data: DataProto, chunk: int) -> float:
    """Forward + backward of the chunked log-probs alone over the batch's response tokens (bf16): their share."""
    from verlx.models.chunked_logprob import chunked_log_probs

    n = int(data.batch["response_mask"].sum())
    hidden = torch.randn(n, hf_config.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    weight = torch.randn(VOCAB, hf_config.hidden_size, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    targets = torch.randint(0, VOCAB, (n,), device="cuda")
    for _ in range(2):  # a warm-up, then the timed run
        torch.cuda.synchronize()
        start = time.perf_counter()
        log_probs, _ = chunked_log_probs(hidden, weight, targets, 1.0, chunk)
        log_probs.sum().backward()
        torch.cuda.synchronize()
    return time.perf_counter() - start


def run_shape(shape: str, args) -> list[dict]:
    from verlx.utils.flops import estimate_flops

    data = synthetic_batch(args.mini_batch, seed=1)
    seq_lens = data.batch["attention_mask"].sum(-1).tolist()
    real_tokens = sum(seq_lens)
    rows = args.rows_per_micro or ROWS_PER_MICRO[shape]
    slots = rows * (PROMPT + RESPONSE)
    budget = args.packed_tokens_per_micro or slots
    rows_out = []
    for mode in args.modes.split(","):
        packed = mode.startswith("packed")
        cfg = ActorConfig(ppo_mini_batch_size=args.mini_batch, use_dynamic_bsz=packed,
                          ppo_max_token_len_per_gpu=budget,
                          logprob_chunk_size=args.compile_chunk if mode.endswith("compile") else args.chunk)
        cfg.optim.lr = 1e-6
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        compiled = mode.endswith("compile")
        if compiled:
            torch._dynamo.reset()  # a trainer process compiles one model shape: do not reuse another shape's graphs
        actor, hf_config = build_actor(shape, packed, cfg, args.gradient_checkpointing, compiled)
        seconds = time_updates(actor, data, args.mini_batch, None if packed else rows, args.warmup, args.steps)
        achieved, peak = estimate_flops(hf_config, seq_lens, seconds)
        row = {
            "shape": shape, "mode": mode, "seconds_per_update": seconds, "real_tokens": real_tokens,
            "token_slots_computed": real_tokens if packed else len(seq_lens) * (PROMPT + RESPONSE),
            "tokens_per_s": real_tokens / seconds, "achieved_tflops": achieved, "peak_tflops": peak,
            "mfu": achieved / peak if peak else None,
            "peak_memory_gb": torch.cuda.max_memory_allocated() / 2**30,
            "micro_batch": f"{budget} tokens" if packed else f"{rows} rows × {PROMPT + RESPONSE}",
        }
        if packed:
            row["attention_kernel"] = attention_kernel_name(hf_config)
            row["logprob_seconds_per_update"] = log_prob_seconds(hf_config, data, cfg.logprob_chunk_size)
        rows_out.append(row)
        print(json.dumps(row), flush=True)
        del actor
        gc.collect()
    return rows_out


def log_prob_memory(args) -> dict:
    """Peak extra memory of log-probs + entropy over 16k tokens: chunked (packed model) vs full HF logits."""
    from transformers import Qwen2ForCausalLM

    from verlx.models.policy import PolicyModel

    rows, prompt, response = args.memory_tokens // 1024, 128, 896
    gc.collect()
    torch.cuda.empty_cache()
    torch.manual_seed(0)
    hf_config = qwen2_config("0.5b")
    hf_config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        hf = Qwen2ForCausalLM(hf_config).to(torch.bfloat16).eval()
    ids = torch.randint(0, VOCAB, (rows, prompt + response), device="cuda")
    mask = torch.ones_like(ids)
    pos = torch.arange(prompt + response, device="cuda").expand(rows, -1)
    out = {}
    with torch.no_grad():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        logits = hf(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        logp_all = torch.log_softmax(logits[:, prompt - 1:-1].float(), dim=-1)
        logp = logp_all.gather(-1, ids[:, prompt:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        torch.cuda.synchronize()
        out["full_logits_peak_gb"] = (torch.cuda.max_memory_allocated() - base) / 2**30
        del logits, logp_all
        torch.cuda.empty_cache()

        model = PolicyModel(hf, packed=True)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        lp, ent = model(ids, mask, pos, response, chunk_size=args.memory_chunk, with_entropy=True)
        torch.cuda.synchronize()
        out["chunked_peak_gb"] = (torch.cuda.max_memory_allocated() - base) / 2**30
        out["max_abs_logprob_diff"] = (lp - logp).abs().max().item()
        out["max_abs_entropy_diff"] = (ent - entropy).abs().max().item()
    out.update(tokens=rows * (prompt + response), vocab=VOCAB, chunk=args.memory_chunk,
               ratio_full_over_chunked=out["full_logits_peak_gb"] / out["chunked_peak_gb"])
    print(json.dumps(out), flush=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="0.5b,1.5b")
    parser.add_argument("--mini-batch", type=int, default=128, help="sequences per optimizer step")
    parser.add_argument("--rows-per-micro", type=int, default=0, help="padded rows per micro-batch (0: per shape)")
    parser.add_argument("--modes", default="padded,packed,packed+compile")
    parser.add_argument("--packed-tokens-per-micro", type=int, default=0,
                        help="token budget of the packed modes' micro-batches (0: the padded mode's token slots)")
    parser.add_argument("--chunk", type=int, default=2048,
                        help="tokens per log-softmax chunk in the eager updates (actor.logprob_chunk_size)")
    parser.add_argument("--compile-chunk", type=int, default=8192,
                        help="the same for packed+compile (fused chunk kernels favour larger chunks)")
    parser.add_argument("--memory-chunk", type=int, default=2048, help="chunk of the log-prob memory measurement")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--memory-tokens", type=int, default=16384)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("train_throughput.py needs a CUDA GPU")
    torch.backends.cuda.matmul.allow_tf32 = True
    init_single_rank()
    device_name = torch.cuda.get_device_name()
    print(f"device {device_name}, torch {torch.__version__}", flush=True)
    start = time.perf_counter()
    results = []
    for shape in args.shapes.split(","):
        results += run_shape(shape, args)
    memory = log_prob_memory(args)
    total = time.perf_counter() - start

    print(f"\n{'shape':6} {'mode':7} {'s/update':>9} {'tokens/s':>10} {'TFLOP/s':>8} {'MFU':>6} {'peak GB':>8}  "
          "micro-batch")
    for r in results:
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "n/a"
        print(f"{r['shape']:6} {r['mode']:7} {r['seconds_per_update']:9.2f} {r['tokens_per_s']:10.0f} "
              f"{r['achieved_tflops']:8.1f} {mfu:>6} {r['peak_memory_gb']:8.1f}  {r['micro_batch']}"
              + (f"  [{r['attention_kernel']}; log-probs {r['logprob_seconds_per_update']:.2f} s]"
                 if "attention_kernel" in r else ""))
    print(f"log-probs over {memory['tokens']} tokens × {VOCAB} vocab: "
          f"full logits {memory['full_logits_peak_gb']:.2f} GB, chunked {memory['chunked_peak_gb']:.2f} GB "
          f"(ratio {memory['ratio_full_over_chunked']:.1f}×)")
    print(f"total {total:.0f} s")
    if os.environ.get("OUT"):
        with open(os.path.join(os.environ["OUT"], "train_throughput.json"), "w") as f:
            json.dump({"device": device_name, "torch": torch.__version__, "args": vars(args), "results": results,
                       "log_prob_memory": memory, "total_seconds": total}, f, indent=2)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
