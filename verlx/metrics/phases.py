"""Per-phase performance metrics of a worker (timed by workers/perf.PhaseTimer): MFU and peak device memory,
agreed over the ranks.

`perf/mfu/<phase>`: FLOPs of the sequences this rank computed (verlx.utils.flops, real tokens only; forward-only
phases count one third of a training step, as veRL does; recomputation by activation checkpointing is not
counted) over the seconds the phase's compute took on this rank, divided by the device's peak — the mean over
ranks. It is absent where the peak is unknown (CPU, a GPU missing from the peak table) unless VERLX_PEAK_TFLOPS
gives one: an MFU against a made-up peak would read like a measurement.

`perf/max_memory_allocated_gb/<phase>`: torch.cuda.max_memory_allocated over the phase (the peak statistics are
reset when the phase starts), less what a sleeping engine keeps allocated to torch without device memory (an
in-process vLLM's unmapped pool: RolloutEngine.unbacked_allocated_bytes, counted by its mapped sizes, so free
space inside the pool's segments makes the correction slightly larger than torch's count), the max over ranks;
absent on CPU.

`perf/device_memory_used_gb/<phase>`: what every process holds on a rank's GPU at the phase's measured point
(rollout: awake, after generating, the engine's KV cache included; update: after the optimizer step), the max over
ranks; `perf/device_memory_imbalance/<phase>`: (max - min) / max over the ranks, the TP memory-imbalance check of
veRL's SGLang guide (a rank holding much more than the others is the one that runs out first); absent on CPU.
Where the spread comes from: `perf/device_memory_most_rank/<phase>` (the rank holding the most),
`perf/device_memory_own_imbalance/<phase>` (the same spread of what the worker's torch allocator reserves) and
`perf/device_memory_others_imbalance/<phase>` (of the rest: the engine's memory — its own processes, or its own
allocator inside the worker — and the CUDA contexts).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from verlx.utils.flops import estimate_flops

MFU_PREFIX = "perf/mfu/"
MEMORY_PREFIX = "perf/max_memory_allocated_gb/"
USED_PREFIX = "perf/device_memory_used_gb/"
IMBALANCE_PREFIX = "perf/device_memory_imbalance/"
MOST_RANK_PREFIX = "perf/device_memory_most_rank/"
OWN_IMBALANCE_PREFIX = "perf/device_memory_own_imbalance/"
OTHERS_IMBALANCE_PREFIX = "perf/device_memory_others_imbalance/"
_NAN = float("nan")


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
    rows = torch.tensor([[tflops / peak if peak else _NAN, _reading(timer.peak_bytes),
                          _reading(timer.device_used_bytes), _reading(timer.own_reserved_bytes)]], dtype=torch.float64)
    if dist.is_initialized():  # one collective: a row per rank
        gathered = [torch.empty_like(rows) for _ in range(dist.get_world_size(group))]
        dist.all_gather(gathered, rows, group=group)
        rows = torch.cat(gathered)
    mfu, peak_bytes, used, own = rows.unbind(1)
    out = {}
    if not mfu.isnan().any():
        out[MFU_PREFIX + phase] = float(mfu.mean())
    if not peak_bytes.isnan().any():
        out[MEMORY_PREFIX + phase] = float(peak_bytes.max()) / 2**30
    if not used.isnan().any():
        out.update({USED_PREFIX + phase: float(used.max()) / 2**30, IMBALANCE_PREFIX + phase: _spread(used),
                    MOST_RANK_PREFIX + phase: float(used.argmax())})
        if not own.isnan().any():
            out[OWN_IMBALANCE_PREFIX + phase] = _spread(own)
            out[OTHERS_IMBALANCE_PREFIX + phase] = _spread(used - own)
    return out


def _reading(value: int | None) -> float:
    return float(value) if value is not None else _NAN


def _spread(values: torch.Tensor) -> float:
    """(max - min) / max over the ranks."""
    most = float(values.max())
    return (most - float(values.min())) / most if most > 0 else 0.0
