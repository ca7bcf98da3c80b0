"""Per-phase performance metrics of a worker (timed by workers/perf.PhaseTimer): MFU and peak device memory,
agreed over the ranks.

`perf/mfu/<phase>`: FLOPs of the sequences this rank computed (verlx.utils.flops, real tokens only; forward-only
phases count one third of a training step, as veRL does; recomputation by activation checkpointing is not
counted) over the seconds the phase's compute took on this rank, divided by the device's peak — the mean over
ranks. It is absent where the peak is unknown (CPU, a GPU missing from the peak table) unless VERLX_PEAK_TFLOPS
gives one: an MFU against a made-up peak would read like a measurement.

`perf/max_memory_allocated_gb/<phase>`: torch.cuda.max_memory_allocated over the phase (the peak statistics are
reset when the phase starts), the max over ranks; absent on CPU.

`perf/device_memory_used_gb/<phase>`: what every process holds on a rank's GPU at the phase's measured point
(rollout: awake, after generating, the engine's KV cache included; update: after the optimizer step), the max over
ranks; `perf/device_memory_imbalance/<phase>`: (max - min) / max over the ranks, the TP memory-imbalance check of
veRL's SGLang guide (a rank holding much more than the others is the one that runs out first); absent on CPU.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verlx.utils.flops import estimate_flops

MFU_PREFIX = "perf/mfu/"
MEMORY_PREFIX = "perf/max_memory_allocated_gb/"
USED_PREFIX = "perf/device_memory_used_gb/"
IMBALANCE_PREFIX = "perf/device_memory_imbalance/"


def phase_metrics(phase: str, hf_config, seq_lens: list[int], timer, forward_only: bool = False,
                  share: float = 1.0, group=None) -> dict[str, float]:
    """The phase's MFU (mean over the ranks of `group`), peak memory and resident device memory (max over them, and
    the resident memory's spread); collective over `group`.

    `seq_lens` are the real lengths of every sequence this rank's compute covered (repeat them for several
    epochs); `share` is the fraction of that work this rank did itself (1 / Ulysses size: the SP ranks of one
    data shard split each sequence).
    """
    achieved, peak = estimate_flops(hf_config, seq_lens, max(timer.seconds, 1e-9)) if seq_lens else (0.0, None)
    tflops = achieved * share / 3 if forward_only else achieved * share
    used = float(timer.device_used_bytes) if timer.device_used_bytes is not None else float("nan")
    mfu = torch.tensor([tflops / peak if peak else float("nan")], dtype=torch.float64)
    maxima = torch.tensor([float(timer.peak_bytes) if timer.peak_bytes is not None else float("nan"), used, -used],
                          dtype=torch.float64)
    if dist.is_initialized():
        dist.all_reduce(mfu, group=group)
        dist.all_reduce(maxima, op=dist.ReduceOp.MAX, group=group)
        mfu /= dist.get_world_size(group)
    out = {}
    if not torch.isnan(mfu[0]):
        out[MFU_PREFIX + phase] = float(mfu[0])
    if not torch.isnan(maxima[0]):
        out[MEMORY_PREFIX + phase] = float(maxima[0]) / 2**30
    if not torch.isnan(maxima[1]):
        most, least = float(maxima[1]), -float(maxima[2])
        out[USED_PREFIX + phase] = most / 2**30
        out[IMBALANCE_PREFIX + phase] = (most - least) / most if most > 0 else 0.0
    return out
