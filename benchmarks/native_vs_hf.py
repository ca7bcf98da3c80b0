"""Rollout throughput on one GPU: the native engine vs transformers `generate`, same weights, same prompts.

Default run (about 2-4 minutes on an H100):
  * Qwen2.5-0.5B and 1.5B shapes with random weights, 256 prompts x 128 tokens, 512 new tokens forced
    (ignore_eos / min_new_tokens), bf16, sampling at T=1: native tokens/s (cold = first call, including CUDA
    graph capture, as in RL where sleep drops the graphs; warm = second call) vs HF generate (sdpa).
  * 1024 prompts on the 0.5B shape: native in full; HF in full if its 256-prompt time says it fits
    --hf-budget-s, otherwise HF is timed for --hf-probe-tokens steps on the full batch and extrapolated
    linearly (labelled; per-step cost grows with the KV length, so this favours HF).
  * Achieved bytes/s of the decode steps (weights + KV actually read) against measured copy bandwidth.
  * Sleep: memory_allocated and mem_get_info before/after; wake_up + update_weights time (0.5B shape).
Results are printed as a table and written as JSON to --json (default: $OUT/native_vs_hf.json if $OUT).
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from verlx.config.roles import EngineKwargs, RolloutConfig  # noqa: E402
from verlx.protocol import DataProto  # noqa: E402
from verlx.rollout.base import RolloutContext  # noqa: E402
from verlx.rollout.native.engine import NativeEngine  # noqa: E402

SHAPES = {  # Qwen2.5 shapes: hidden, layers, heads, kv heads, intermediate (vocab 151936, tied embeddings)
    "0.5b": dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                 intermediate_size=4864),
    "1.5b": dict(hidden_size=1536, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2,
                 intermediate_size=8960),
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128),  # smoke test of this script (e.g. --device cpu)
}
DEVICE = torch.device("cuda")
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="0.5b,1.5b", help="comma list of " + ",".join(SHAPES))
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--new-tokens", type=int, default=512)
    p.add_argument("--large-prompts", type=int, default=1024, help="0 skips the large-batch run (0.5B shape)")
    p.add_argument("--large-max-num-seqs", type=int, default=1024)
    p.add_argument("--large-shape", default="0.5b", help="shape of the large-batch and sleep/wake measurements")
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=16384)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    p.add_argument("--kv-len-block", type=int, default=128)
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy for both engines")
    p.add_argument("--enforce-eager", action="store_true", help="native without CUDA graphs")
    p.add_argument("--decode-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--sampler", default="auto", choices=["auto", "torch", "triton"],
                   help="native token sampler (auto: fused triton kernels on CUDA)")
    p.add_argument("--no-backend-comparison", action="store_true",
                   help="skip the extra native run of the large shape with the other decode backend")
    p.add_argument("--skip-hf", action="store_true")
    p.add_argument("--hf-cache", default="auto", choices=["auto", "dynamic", "static", "static-compiled"],
                   help="HF KV cache; auto probes dynamic and static (no torch.compile) and keeps the faster; "
                        "static-compiled lets transformers torch.compile the decode step (compiled in an untimed "
                        "warm-up; can take minutes)")
    p.add_argument("--hf-budget-s", type=float, default=90.0, help="longest HF run allowed before extrapolating")
    p.add_argument("--hf-probe-tokens", type=int, default=64)
    p.add_argument("--sleep-level", type=int, default=2, help="engine sleep level for the sleep/wake measurement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None)
    p.add_argument("--device", default="cuda", help="cpu only smoke-tests this script (tiny shape)")
    return p.parse_args()


# ------------------------------------------------------------------ helpers
def sync():
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


def timed(fn):
    sync()
    start = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - start


def free_memory():
    gc.collect()
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()


def copy_bandwidth(gib: float = 1.0) -> float:
    """Device-to-device copy bytes/s (read + write) of a `gib`-GiB buffer, best of 10."""
    n = int(gib * 2**30) // 2
    src = torch.empty(n, dtype=torch.bfloat16, device=DEVICE)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(timed(functools.partial(dst.copy_, src))[1] for _ in range(10))
    del src, dst
    free_memory()
    return 2 * n * 2 / best


def qwen2_config(shape: str, max_positions: int):
    import transformers

    return transformers.Qwen2Config(
        vocab_size=151936, tie_word_embeddings=True, rms_norm_eps=1e-6, rope_theta=1000000.0,
        max_position_embeddings=max(32768, max_positions), **SHAPES[shape],
    )


def hf_model(config, dtype):
    import transformers

    with DEVICE:
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return model.to(dtype).eval()


def random_prompts(n: int, length: int, vocab: int, seed: int) -> DataProto:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (n, length), generator=gen).to(DEVICE)
    mask = torch.ones_like(ids)
    pos = torch.arange(length, device=DEVICE).expand(n, -1).contiguous()
    return DataProto({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def native_engine(args, config, max_num_seqs: int, backend: str | None = None) -> NativeEngine:
    rollout = RolloutConfig(
        prompt_length=args.prompt_len, response_length=args.new_tokens, dtype=args.dtype,
        gpu_memory_utilization=args.gpu_memory_utilization, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, enforce_eager=args.enforce_eager,
        load_format="dummy", sleep_level=args.sleep_level, seed=args.seed,
        engine_kwargs=EngineKwargs(native={"kv_len_block": args.kv_len_block,
                                           "decode_backend": backend or args.decode_backend,
                                           "sampler": args.sampler}),
    )
    ctx = RolloutContext(config=rollout, model_path="<random>", hf_config=config, device=DEVICE,
                         pad_token_id=0, eos_token_ids=[151643])
    return NativeEngine(ctx)


def sampling_meta(args) -> dict:
    if args.temperature <= 0:
        return dict(do_sample=False, ignore_eos=True, max_new_tokens=args.new_tokens)
    return dict(do_sample=True, temperature=args.temperature, top_p=1.0, top_k=-1, ignore_eos=True,
                max_new_tokens=args.new_tokens, seed=args.seed)


def run_native(args, engine: NativeEngine, prompts: DataProto) -> dict:
    batch = DataProto(prompts.batch, {}, sampling_meta(args))
    tokens = len(prompts) * args.new_tokens
    result = {}
    for label in ("cold", "warm"):
        out, t = timed(lambda: engine.generate(batch))
        generated = int(out.batch["response_mask"].sum())
        assert generated == tokens, f"native generated {generated} tokens, expected {tokens}"
        stats = engine.last_stats
        result[label] = dict(seconds=t, tokens_per_s=tokens / t, **stats)
        del out
    result["decode_backend"] = engine.decode_backend
    result["sampler"] = engine.sampler.name
    warm = result["warm"]
    decode_bytes = warm["kv_bytes_read"] + warm["weight_bytes_read"]
    result["decode_bytes_per_s"] = decode_bytes / warm["decode_s"] if warm["decode_s"] > 0 else None
    result["decode_step_ms"] = 1e3 * warm["decode_s"] / max(1, warm["decode_steps"])
    return result


def stop_after_steps(steps: int):
    """A stopping criterion ending generate after `steps` tokens while the cache keeps its full size."""
    import transformers

    class StopAfter(transformers.StoppingCriteria):
        calls = 0

        def __call__(self, input_ids, scores, **kwargs):
            self.calls += 1
            return torch.full((input_ids.shape[0],), self.calls >= steps, dtype=torch.bool, device=input_ids.device)

    return transformers.StoppingCriteriaList([StopAfter()])


def hf_generate(model, prompts: DataProto, new_tokens: int, temperature: float, cache: str, stop_after: int = 0):
    kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=0)
    if temperature > 0:
        kwargs.update(do_sample=True, temperature=temperature, top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False)
    if cache == "static":
        kwargs.update(cache_implementation="static", disable_compile=True)
    if cache == "static-compiled":
        kwargs.update(cache_implementation="static")
    if stop_after:
        kwargs.update(stopping_criteria=stop_after_steps(stop_after))
    with torch.no_grad():
        return model.generate(prompts.batch["input_ids"], attention_mask=prompts.batch["attention_mask"], **kwargs)


def hf_seconds(args, model, prompts, new_tokens, cache) -> float:
    _, t = timed(lambda: hf_generate(model, prompts, new_tokens, args.temperature, cache))
    return t


def hf_warmup(args, model, prompts, cache) -> None:
    """Untimed: a few steps with the full-size cache (compiles the decode step for static-compiled)."""
    hf_generate(model, prompts, args.new_tokens, args.temperature, cache, stop_after=4)


def choose_hf_cache(args, model, prompts, report: dict) -> str:
    if args.hf_cache != "auto":
        return args.hf_cache
    probe = {}
    for cache in ("dynamic", "static"):
        try:
            hf_seconds(args, model, prompts, 4, cache)  # warm-up
            probe[cache] = hf_seconds(args, model, prompts, 32, cache)
        except Exception as err:  # an older/newer transformers without this option
            probe[cache] = f"failed: {err}"
    report["hf_cache_probe_s_32_tokens"] = probe
    timings = {k: v for k, v in probe.items() if isinstance(v, float)}
    return min(timings, key=timings.get) if timings else "dynamic"


def run_hf(args, model, prompts: DataProto, report: dict, cache: str | None = None) -> dict:
    cache = cache or choose_hf_cache(args, model, prompts, report)
    tokens = len(prompts) * args.new_tokens
    hf_warmup(args, model, prompts, cache)
    t = hf_seconds(args, model, prompts, args.new_tokens, cache)
    return dict(cache=cache, seconds=t, tokens_per_s=tokens / t, measured="full")


def run_hf_large(args, model, prompts: DataProto, small_seconds: float, cache: str) -> dict:
    """Full run if 4x the small run fits the budget, else a timed prefix of the full batch, extrapolated."""
    tokens = len(prompts) * args.new_tokens
    estimate = small_seconds * len(prompts) / args.prompts
    hf_warmup(args, model, prompts, cache)
    if estimate <= args.hf_budget_s:
        t = hf_seconds(args, model, prompts, args.new_tokens, cache)
        return dict(cache=cache, seconds=t, tokens_per_s=tokens / t, measured="full")
    probe = min(args.hf_probe_tokens, args.new_tokens)
    t_probe = hf_seconds(args, model, prompts, probe, cache)
    t = t_probe * args.new_tokens / probe
    return dict(cache=cache, seconds=t, tokens_per_s=tokens / t,
                measured=f"extrapolated from {probe}/{args.new_tokens} steps on all {len(prompts)} prompts "
                         f"(linear; real per-step cost grows with KV length, so this favours HF)")


def measure_sleep(args, engine: NativeEngine, hf, before_engine_alloc: int) -> dict:
    free_memory()
    held_alloc = torch.cuda.memory_allocated() - before_engine_alloc
    alloc0, free0 = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    engine.sleep()
    sync()
    alloc1, free1 = torch.cuda.memory_allocated(), torch.cuda.mem_get_info()[0]
    weights = list(hf.state_dict().items())

    def wake_and_push():
        engine.wake_up(["weights"])
        engine.update_weights(weights)
        engine.wake_up(["kv_cache"])

    _, wake_s = timed(wake_and_push)
    return dict(
        sleep_level=args.sleep_level,
        engine_held_bytes=held_alloc,
        freed_memory_allocated=alloc0 - alloc1,
        freed_mem_get_info=free1 - free0,
        freed_fraction_allocated=(alloc0 - alloc1) / held_alloc,
        freed_fraction_mem_get_info=(free1 - free0) / held_alloc,
        wake_update_s=wake_s,
    )


# ------------------------------------------------------------------ main
def bench_shape(args, shape: str, report: dict) -> None:
    dtype = DTYPES[args.dtype]
    config = qwen2_config(shape, args.prompt_len + args.new_tokens)
    section = report.setdefault(shape, {})
    hf = hf_model(config, dtype)
    prompts = random_prompts(args.prompts, args.prompt_len, config.vocab_size, args.seed)
    before = torch.cuda.memory_allocated() if DEVICE.type == "cuda" else 0
    engine = native_engine(args, config, args.max_num_seqs)
    engine.update_weights(hf.state_dict().items())
    section["native"] = run_native(args, engine, prompts)
    if not args.skip_hf:
        section["hf"] = run_hf(args, hf, prompts, report.setdefault("hf_probe", {}).setdefault(shape, {}))
        section["speedup_warm"] = section["native"]["warm"]["tokens_per_s"] / section["hf"]["tokens_per_s"]
        section["speedup_cold"] = section["native"]["cold"]["tokens_per_s"] / section["hf"]["tokens_per_s"]
    if shape == args.large_shape and DEVICE.type == "cuda":
        section["sleep"] = measure_sleep(args, engine, hf, before)
    used = engine.decode_backend
    del engine
    free_memory()
    if shape == args.large_shape and not args.no_backend_comparison:
        other = "torch" if used == "triton" else "triton"
        try:
            engine = native_engine(args, config, args.max_num_seqs, other)
            if engine.decode_backend == other:  # triton may fall back to torch after its self-test
                engine.update_weights(hf.state_dict().items())
                report[f"{shape}_{other}"] = dict(native=run_native(args, engine, prompts))
            del engine
        except Exception:
            report["errors"].append(f"{shape} with decode_backend={other}: {traceback.format_exc()}")
        free_memory()
    if shape == args.large_shape and args.large_prompts:
        large = report.setdefault(f"{shape}_x{args.large_prompts}", {})
        prompts = random_prompts(args.large_prompts, args.prompt_len, config.vocab_size, args.seed + 1)
        engine = native_engine(args, config, args.large_max_num_seqs)
        engine.update_weights(hf.state_dict().items())
        large["native"] = run_native(args, engine, prompts)
        del engine
        free_memory()
        if not args.skip_hf and "hf" in section:
            large["hf"] = run_hf_large(args, hf, prompts, section["hf"]["seconds"], section["hf"]["cache"])
            large["speedup_warm"] = large["native"]["warm"]["tokens_per_s"] / large["hf"]["tokens_per_s"]
            large["speedup_cold"] = large["native"]["cold"]["tokens_per_s"] / large["hf"]["tokens_per_s"]
    del hf
    free_memory()


def print_table(report: dict) -> None:
    bw = report["copy_bandwidth_bytes_per_s"]
    print(f"\ndevice: {report['device']}  torch {report['torch']}  copy bandwidth {bw / 1e12:.2f} TB/s")
    header = f"{'run':<16}{'backend':>8}{'native cold':>13}{'native warm':>13}{'HF':>11}{'x cold':>8}{'x warm':>8}" \
             f"{'step ms':>9}{'decode TB/s':>13}{'of copy':>9}  HF measured"
    print(header)
    print("-" * len(header))
    for name, sec in report.items():
        if not isinstance(sec, dict) or "native" not in sec:
            continue
        nat, hf = sec["native"], sec.get("hf")
        bps = nat.get("decode_bytes_per_s") or 0.0
        hf_tps = f"{hf['tokens_per_s']:>11,.0f}" if hf else f"{'-':>11}"
        x_cold = f"{sec['speedup_cold']:>8.1f}" if hf else f"{'-':>8}"
        x_warm = f"{sec['speedup_warm']:>8.1f}" if hf else f"{'-':>8}"
        cold, warm = nat["cold"]["tokens_per_s"], nat["warm"]["tokens_per_s"]
        print(f"{name:<16}{nat['decode_backend']:>8}{cold:>13,.0f}{warm:>13,.0f}{hf_tps}"
              f"{x_cold}{x_warm}{nat['decode_step_ms']:>9.2f}{bps / 1e12:>13.2f}{bps / bw:>9.0%}  "
              f"{(hf['measured'] + ', ' + hf['cache'] + ' cache') if hf else '-'}")
    sleep = report.get(report["args"]["large_shape"], {}).get("sleep")
    if sleep:
        print(f"sleep (level {sleep['sleep_level']}): engine held {sleep['engine_held_bytes'] / 2**30:.2f} GiB; "
              f"freed {sleep['freed_fraction_allocated']:.1%} (memory_allocated), "
              f"{sleep['freed_fraction_mem_get_info']:.1%} (mem_get_info); "
              f"wake_up + update_weights {sleep['wake_update_s'] * 1e3:.0f} ms")
    for err in report.get("errors", []):
        lines = err.strip().splitlines()
        print("ERROR", lines[0].split(":")[0], "->", lines[-1])


def use_device(name: str, script: str = "native_vs_hf.py") -> torch.device:
    """The device every helper here builds on (DEVICE); exits with a message where a CUDA GPU is asked for and
    none is visible."""
    global DEVICE
    DEVICE = torch.device(name)
    if DEVICE.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"{script} needs a CUDA GPU (--device cpu only smoke-tests the script)")
    return DEVICE


def main():
    args = parse_args()
    use_device(args.device)
    torch.manual_seed(args.seed)
    start = time.perf_counter()
    name = torch.cuda.get_device_name() if DEVICE.type == "cuda" else "cpu"
    report = dict(device=name, torch=torch.__version__, args=vars(args), errors=[])
    report["copy_bandwidth_bytes_per_s"] = copy_bandwidth()
    for shape in args.shapes.split(","):
        try:
            bench_shape(args, shape, report)
        except Exception:  # keep the other shapes' numbers
            report["errors"].append(f"{shape}: {traceback.format_exc()}")
            traceback.print_exc()
            free_memory()
    report["total_s"] = time.perf_counter() - start
    print_table(report)
    print(f"total {report['total_s']:.0f} s")
    path = args.json or (os.path.join(os.environ["OUT"], "native_vs_hf.json") if os.environ.get("OUT") else None)
    if path:
        with open(path, "w") as f:
            json.dump(report, f, indent=2, default=str)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
