"""Where the native engine's decode time goes: torch.profiler over one generate call, top CUDA kernels, and the
device time per decode step by kernel family; `--kernels` also times the sampler and RMSNorm alone.

  python benchmarks/profile_native_decode.py --shape 0.5b --prompts 256 --new-tokens 128 [--kernels]
  python benchmarks/profile_native_decode.py --device cpu --shape tiny --prompts 4 --new-tokens 4   # smoke test
Prints the kernels ranked by total device time (CUDA-graph replays included), a per-step breakdown (the one
prefill of the call included, so divide-by-steps slightly overstates the decode kernels it shares names with)
and writes a chrome trace to $OUT. --decode-backend / --sampler pick the engine's implementations.
"""

from __future__ import annotations

import argparse
import os
import re
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import native_vs_hf as rt  # noqa: E402

from verlx.protocol import DataProto  # noqa: E402

FAMILIES = [  # (family, kernel-name pattern), first match wins
    ("sampler (fused)", r"_group_stats_kernel|_finish_kernel"),
    ("sampler (torch ops)", r"scan|softmax|sort|topk|searchsorted|argmax|logsumexp|reduce_kernel"),
    ("attention", r"_decode_attention_kernel|_combine_kernel|fmha|flash|attention"),
    ("rms_norm", r"_rms_norm_kernel|layer_norm"),
    ("rope + kv write", r"_rope_cache_kernel"),
    ("swiglu", r"_swiglu_kernel"),
    ("gemm (layers + lm_head)", r"gemm|nvjet|xmma|cutlass|cublas|sm90_|sm80_"),
]


def _device_time_us(evt) -> float:
    return float(getattr(evt, "device_time_total", None) or getattr(evt, "cuda_time_total", 0.0))


def per_step_breakdown(prof, steps: int) -> list[tuple[str, float, int]]:
    """(family, device µs per decode step, kernel launches per step) over the CUDA kernels of the profile."""
    from torch.autograd import DeviceType

    totals: dict[str, list[float]] = {}
    for evt in prof.key_averages():
        if getattr(evt, "device_type", None) != DeviceType.CUDA:
            continue
        family = next((f for f, pattern in FAMILIES if re.search(pattern, evt.key, re.IGNORECASE)), "other")
        entry = totals.setdefault(family, [0.0, 0])
        entry[0] += _device_time_us(evt)
        entry[1] += evt.count
    rows = [(family, t / steps, round(n / steps)) for family, (t, n) in totals.items()]
    return sorted(rows, key=lambda r: -r[1])


def time_kernels(config, batch: int, dtype: torch.dtype) -> None:
    """µs per call (CUDA events, median of 50) of the pieces this branch replaced, at decode sizes."""
    from verlx.rollout.native.sampling import SamplingPlan, sample_tokens
    from verlx.rollout.native.triton_ops import TritonDecodeOps
    from verlx.rollout.native.triton_sampling import TritonSampler

    def median_us(fn, reps: int = 50) -> float:
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return sorted(times)[reps // 2]

    device = torch.device("cuda")
    vocab, hidden = config.vocab_size, config.hidden_size
    logits = (torch.randn(batch, vocab, device=device) * 3).to(dtype)
    h = torch.randn(batch, hidden, device=device).to(dtype)
    lm_head = (torch.randn(vocab, hidden, device=device) * 0.02).to(dtype)
    norm_w = torch.ones(hidden, device=device, dtype=dtype)
    seeds = torch.arange(batch, device=device)
    steps = torch.zeros(batch, dtype=torch.long, device=device)
    plan = SamplingPlan(greedy=False, temperature=1.0, top_k=0, top_p=1.0, min_new_tokens=0, max_new_tokens=8,
                        ignore_eos=True, stop_token_ids=())
    sampler = TritonSampler(device)
    results = {
        "sampler: fused triton (stats + finish)": median_us(lambda: sampler.sample(logits, plan, None, seeds, steps)),
        "sampler: torch ops (same draws)": median_us(lambda: sample_tokens(logits, plan, None, seeds, steps)),
        f"lm_head GEMM [{batch}x{hidden}] @ [{hidden}x{vocab}]":
            median_us(lambda: torch.nn.functional.linear(h, lm_head)),
        "rms_norm: triton": median_us(lambda: TritonDecodeOps.rms_norm(h, norm_w, 1e-6)),
        "rms_norm: torch F.rms_norm": median_us(lambda: torch.nn.functional.rms_norm(h, (hidden,), norm_w, 1e-6)),
    }
    print(f"\nkernel timings at batch {batch} (eager launches, so small kernels include launch latency):")
    for name, us in results.items():
        print(f"  {name:<60}{us:>9.1f} us")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="0.5b")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--decode-backend", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--sampler", default="auto", choices=["auto", "torch", "triton"])
    p.add_argument("--kernels", action="store_true", help="also time the sampler, lm_head and RMSNorm alone")
    p.add_argument("--device", default="cuda", help="cpu only smoke-tests this script (no device kernels to rank)")
    cli = p.parse_args()
    if cli.device == "cpu" and cli.kernels:
        p.error("--kernels times CUDA kernels: it needs --device cuda")
    sys.argv = [sys.argv[0], "--prompts", str(cli.prompts), "--new-tokens", str(cli.new_tokens),
                "--decode-backend", cli.decode_backend, "--sampler", cli.sampler, "--device", cli.device]
    args = rt.parse_args()
    on_cuda = rt.use_device(cli.device, "profile_native_decode.py").type == "cuda"
    config = rt.qwen2_config(cli.shape, args.prompt_len + args.new_tokens)
    engine = rt.native_engine(args, config, max_num_seqs=cli.prompts)
    hf = rt.hf_model(config, rt.DTYPES[args.dtype])  # the engine starts with random (dummy) weights: push real ones
    engine.update_weights(hf.state_dict().items())
    del hf
    prompts = rt.random_prompts(cli.prompts, args.prompt_len, config.vocab_size, args.seed)
    batch = DataProto(prompts.batch, {}, rt.sampling_meta(args))
    engine.generate(batch)  # warm: graphs captured
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])) as prof:
        engine.generate(batch)
        if on_cuda:
            torch.cuda.synchronize()
    stats = engine.last_stats
    steps = max(1, stats.get("decode_steps") or 0)
    print(f"decode backend {engine.decode_backend}, sampler {engine.sampler.name}: decode {stats['decode_s']:.3f}s "
          f"over {steps} steps ({1e3 * stats['decode_s'] / steps:.3f} ms/step), prefill {stats['prefill_s']:.3f}s")
    print(prof.key_averages().table(sort_by="cuda_time_total" if on_cuda else "cpu_time_total", row_limit=cli.top,
                                    max_name_column_width=70))
    print("device time per decode step by kernel family:")
    total = 0.0
    for family, us, launches in per_step_breakdown(prof, steps):
        total += us
        print(f"  {family:<28}{us:>9.1f} us  {launches:>4} launches")
    print(f"  {'total':<28}{total:>9.1f} us")
    if cli.kernels:
        time_kernels(config, cli.prompts, rt.DTYPES[args.dtype])
    if os.environ.get("OUT"):
        prof.export_chrome_trace(os.path.join(os.environ["OUT"], "native_decode_trace.json"))


if __name__ == "__main__":
    main()
