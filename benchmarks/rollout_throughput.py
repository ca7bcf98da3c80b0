"""Rollout engines side by side: same checkpoint, same prompts, what RL asks of them.

  python benchmarks/rollout_throughput.py --engines native,sglang,vllm,hf --shapes 0.5b,1.5b,7b \\
      --engine-path sglang=/tmp/engine-sglang --engine-path vllm=/tmp/engine-vllm

Per shape the driver writes one random-weight Qwen2.5-shaped checkpoint (bf16, tied embeddings as the real 0.5B
and 1.5B have; untied for 7B), then runs every engine in its own process (SGLang and vLLM pin different packages, so
each gets only its own `--engine-path` on PYTHONPATH) through verlx's RolloutEngine interface, exactly as the RL
worker drives it: 256 prompts x 128 tokens, 512 new tokens forced (ignore_eos), T=1, log-probs returned.
Each engine process reports
  * cold tok/s (first generate: CUDA graphs, caches) and warm tok/s (second generate),
  * wake + push: sleep, then wake_up(weights) + update_weights(the whole model from a GPU copy) + wake_up(kv_cache),
  * what the sleeping engine keeps on the device: mem_get_info's used bytes after its sleep minus before it was
    built (its processes' CUDA contexts, graphs, pools),
  * mean |log-prob difference| of 8 sampled responses against transformers' forward pass, before the sleep and
    after the wake and push (throughput of wrong tokens is worth nothing; resumed CUDA graphs must still hold).
The table prints each engine's warm tok/s and its ratio to the best external engine (sglang, vllm).
--device cpu smoke-tests the script with the tiny shape (native and hf).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine_env import engine_env  # noqa: E402

SHAPES = {  # Qwen2.5 shapes (vocab 151936)
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864, tie_word_embeddings=True),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
               intermediate_size=18944, tie_word_embeddings=False),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, tie_word_embeddings=True),
}
EXTERNAL = ("sglang", "vllm")
CHECKED_SAMPLES = 8


def build_checkpoint(path: str, shape: str, device: str) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(**SHAPES[shape], vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
                         eos_token_id=151645, pad_token_id=151643, dtype="bfloat16")
    torch.manual_seed(0)
    default_dtype = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # a 7B model built in fp32 took 30 GiB
    try:
        with torch.device(device):
            model = Qwen2ForCausalLM(config)
    finally:
        torch.set_default_dtype(default_dtype)
    model.save_pretrained(path)
    del model
    if device == "cuda":  # the engine processes need the memory: the driver's cache once starved vLLM at 7B
        torch.cuda.empty_cache()


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


def _used_bytes(device) -> int:
    import torch

    free, total = torch.cuda.mem_get_info(device)
    return total - free


def _prompts(args, vocab: int):
    import torch

    from verlx.protocol import DataProto

    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(0, vocab - 1000, (args.prompts, args.prompt_len), generator=g)
    mask = torch.ones_like(ids)
    meta = {"do_sample": True, "temperature": 1.0, "ignore_eos": True, "max_new_tokens": args.new_tokens}
    return DataProto({"input_ids": ids, "attention_mask": mask,
                      "position_ids": torch.arange(args.prompt_len).expand_as(ids).clone()}, meta_info=meta)


def _logprob_gap(model, out, prompt_len: int, device) -> float:
    """mean |rollout log-prob - transformers log-prob| over the first CHECKED_SAMPLES responses (T=1)."""
    import torch

    rows = slice(0, CHECKED_SAMPLES)
    ids = out.batch["input_ids"][rows].to(device)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[:, prompt_len - 1:-1].float()
    reference = torch.log_softmax(logits, -1).gather(-1, ids[:, prompt_len:, None]).squeeze(-1)
    mask = out.batch["response_mask"][rows].to(device).bool()
    gap = (out.batch["rollout_log_probs"][rows].to(device) - reference).abs()
    return float(gap[mask].mean())


def run_engine(args) -> dict:
    """One engine on one checkpoint (runs in its own process)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from verlx.config.roles import RolloutConfig
    from verlx.rollout.base import RolloutContext, get_engine_class
    from verlx.utils.distributed import init_distributed

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    init_distributed()  # vLLM's external launcher joins the (one-rank) world
    hf_config = AutoConfig.from_pretrained(args.model)
    trainer_copy = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16).to(device).eval()
    config = RolloutConfig(name=args.worker, prompt_length=args.prompt_len, response_length=args.new_tokens,
                           load_format="auto", calculate_log_probs=True,
                           gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=args.prompts,
                           sleep_level=args.sleep_level)
    ctx = RolloutContext(config=config, model_path=args.model, hf_config=hf_config, device=device,
                         pad_token_id=hf_config.pad_token_id, eos_token_ids=[hf_config.eos_token_id])
    record: dict = {"engine": args.worker, "shape": args.shape}
    used_before = _used_bytes(device) if device.type == "cuda" else None
    start = time.perf_counter()
    engine = get_engine_class(args.worker)(ctx)
    record["start_s"] = time.perf_counter() - start
    prompts = _prompts(args, hf_config.vocab_size)
    tokens = args.prompts * args.new_tokens
    for label in ("cold", "warm"):
        _sync(device)
        t0 = time.perf_counter()
        out = engine.generate(prompts)
        _sync(device)
        record[f"{label}_s"] = time.perf_counter() - t0
        record[f"{label}_tok_s"] = tokens / record[f"{label}_s"]
        generated = int(out.batch["response_mask"].sum())
        if generated != tokens:
            raise RuntimeError(f"{args.worker} generated {generated} tokens, {tokens} were forced")
    record["logprob_gap"] = _logprob_gap(trainer_copy, out, args.prompt_len, device)
    engine.sleep()
    _sync(device)
    if used_before is not None:  # what the sleeping engine keeps: device memory in use now minus before it existed
        record["asleep_used_gb"] = (_used_bytes(device) - used_before) / 2**30
    t0 = time.perf_counter()
    engine.wake_up(["weights"])
    engine.update_weights(trainer_copy.named_parameters())
    engine.wake_up(["kv_cache"])
    _sync(device)
    record["wake_push_s"] = time.perf_counter() - t0
    # awake again, with the pushed weights and resumed KV cache and CUDA graphs: the log-probs must still agree
    again = engine.generate(_prompts(argparse.Namespace(**{**vars(args), "prompts": CHECKED_SAMPLES}),
                                     hf_config.vocab_size))
    record["logprob_gap_after_wake"] = _logprob_gap(trainer_copy, again, args.prompt_len, device)
    if hasattr(engine, "shutdown"):
        engine.shutdown()
    return record


def drive(args) -> list[dict]:
    paths = dict(item.split("=", 1) for item in args.engine_path)
    records = []
    for shape in args.shapes.split(","):
        with tempfile.TemporaryDirectory(prefix=f"verlx-rt-{shape}-") as model:
            build_checkpoint(model, shape, args.device)
            for engine in args.engines.split(","):
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", engine, "--model", model, "--shape",
                       shape, *_passed_through(args)]
                print(f"[{shape}] {engine} ...", flush=True)
                env = engine_env(engine, paths, ROOT, MASTER_ADDR="127.0.0.1", RANK="0", WORLD_SIZE="1",
                                 LOCAL_RANK="0", MASTER_PORT=str(29500 + os.getpid() % 1000))
                done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.engine_timeout_s)
                lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
                if done.returncode or not lines:
                    tail = "\n".join((done.stdout + done.stderr).splitlines()[-25:])
                    print(f"[{shape}] {engine} FAILED (rc {done.returncode}):\n{tail}", flush=True)
                    records.append({"engine": engine, "shape": shape, "error": tail[-2000:]})
                    continue
                records.append(json.loads(lines[-1][len("RESULT "):]))
                print(f"[{shape}] {engine}: {json.dumps(records[-1])}", flush=True)
    return records


def _passed_through(args) -> list[str]:
    return ["--prompts", str(args.prompts), "--prompt-len", str(args.prompt_len), "--new-tokens",
            str(args.new_tokens), "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--sleep-level",
            str(args.sleep_level), "--seed", str(args.seed), "--device", args.device]


def table(records: list[dict]) -> str:
    lines = ["| shape | engine | cold tok/s | warm tok/s | vs best external | start s | wake+push s | "
             "asleep GiB | log-prob gap | gap after wake |", "|---" * 10 + "|"]
    for shape in dict.fromkeys(r["shape"] for r in records):
        rows = [r for r in records if r["shape"] == shape]
        best = max((r["warm_tok_s"] for r in rows if r["engine"] in EXTERNAL and "error" not in r), default=None)
        for r in rows:
            if "error" in r:
                lines.append(f"| {shape} | {r['engine']} | failed | | | | | | | |")
                continue
            ratio = f"{r['warm_tok_s'] / best:.2f}x" if best else "-"
            lines.append(f"| {shape} | {r['engine']} | {r['cold_tok_s']:,.0f} | {r['warm_tok_s']:,.0f} | {ratio} | "
                         f"{r['start_s']:.1f} | {r['wake_push_s']:.2f} | {r.get('asleep_used_gb', float('nan')):.2f} | "
                         f"{r['logprob_gap']:.4f} | {r['logprob_gap_after_wake']:.4f} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--engines", default="native,sglang,vllm,hf")
    p.add_argument("--shapes", default="0.5b,1.5b,7b", help="comma list of " + ",".join(SHAPES))
    p.add_argument("--engine-path", action="append", default=[], metavar="ENGINE=DIR",
                   help="a directory to put first on PYTHONPATH for that engine's process (its bundle)")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--sleep-level", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--engine-timeout-s", type=float, default=900)
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu only smoke-tests this script")
    p.add_argument("--json", default=None)
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--model", help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print("RESULT " + json.dumps(run_engine(args)), flush=True)
        return 0
    records = drive(args)
    print("\n" + table(records))
    path = args.json or (os.path.join(os.environ["OUT"], "rollout_throughput.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(records, f, indent=1)
    return int(any("error" in r for r in records))


if __name__ == "__main__":
    sys.exit(main())
