"""Per-phase performance metrics of a worker (timed by workers/perf.PhaseTimer): MFU and peak device memory,
agreed over the ranks.

`perf/mfu/<phase>`: FLOPs of the sequences this rank computed (verlx.utils.flops, real tokens only; forward-only
phases count one third of a training step, as veRL does; recomputation by activation checkpointing is not
counted) over the seconds the phase's compute took on this rank, divided by the device's peak — the mean over
ranks. It is absent where the peak is unknown (CPU, a GPU missing from the peak table) unless VERLX_PEAK_TFLOPS
gives one: an MFU against a made-up peak would read like a measurement.

`perf/max_memory_allocated_gb/<phase>`: torch.cuda.max_memory_allocated over the phase (the peak statistics are
reset when the phase starts), the max over ranks; absent on CPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verlx.utils.flops import estimate_flops

MFU_PREFIX = "perf/mfu/"
MEMORY_PREFIX = "perf/max_memory_allocated_gb/"


def phase_metrics(phase: str, hf_config, seq_lens: list[int], timer, forward_only: bool = False,
                  share: float = 1.0, group=None) -> dict[str, float]:
    """The phase's MFU (mean over the ranks of `group`) and peak memory (max over them); collective over `group`.

    `seq_lens` are the real lengths of every sequence this rank's compute covered (repeat them for several
    epochs); `share` is the fraction of that work this rank did itself (1 / Ulysses size: the SP ranks of one
    data shard split each sequence).
    """
    achieved, peak = estimate_flops(hf_config, seq_lens, max(timer.seconds, 1e-9)) if seq_lens else (0.0, None)
    tflops = achieved * share / 3 if forward_only else achieved * share
    values = torch.tensor([tflops / peak if peak else float("nan"),
                           float(timer.peak_bytes) if timer.peak_bytes is not None else float("nan")],
                          dtype=torch.float64)
    if dist.is_initialized():
        mean_mfu, max_bytes = values[:1].clone(), values[1:].clone()
        dist.all_reduce(mean_mfu, group=group)
        dist.all_reduce(max_bytes, op=dist.ReduceOp.MAX, group=group)
        values = torch.cat([mean_mfu / dist.get_world_size(group), max_bytes])
    out = {}
    if not torch.isnan(values[0]):
        out[MFU_PREFIX + phase] = float(values[0])
    if not torch.isnan(values[1]):
        out[MEMORY_PREFIX + phase] = float(values[1]) / 2**30
    return out

