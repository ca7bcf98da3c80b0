"""Where the native engine's decode time goes: torch.profiler over one generate call, top CUDA kernels.

  python benchmarks/profile_native_decode.py --shape 0.5b --prompts 256 --new-tokens 128
Prints the kernels ranked by total device time (CUDA-graph replays included) and writes a chrome trace to $OUT.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rollout_throughput as rt  # noqa: E402
from verlx.protocol import DataProto  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--shape", default="0.5b")
    p.add_argument("--prompts", type=int, default=256)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--top", type=int, default=25)
    cli = p.parse_args()
    sys.argv = [sys.argv[0], "--prompts", str(cli.prompts), "--new-tokens", str(cli.new_tokens)]
    args = rt.parse_args()
    config = rt.qwen2_config(cli.shape, args.prompt_len + args.new_tokens)
    engine = rt.native_engine(args, config, max_num_seqs=cli.prompts)
    prompts = rt.random_prompts(cli.prompts, args.prompt_len, config.vocab_size, args.seed)
    batch = DataProto(prompts.batch, {}, rt.sampling_meta(args))
    engine.generate(batch)  # warm: graphs captured
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        engine.generate(batch)
        torch.cuda.synchronize()
    stats = engine.last_stats
    print(f"decode {stats.get('decode_s', 0):.3f}s over {stats.get('decode_steps')} steps, "
          f"prefill {stats.get('prefill_s', 0):.3f}s")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=cli.top, max_name_column_width=70))
    if os.environ.get("OUT"):
        prof.export_chrome_trace(os.path.join(os.environ["OUT"], "native_decode_trace.json"))


if __name__ == "__main__":
    main()
