"""Timing and throughput metrics of one step (veRL names)."""

from __future__ import annotations

from verlx.protocol import DataProto

# phase → which token count its per-token time divides by
_PER_TOKEN_BASIS = {
    "gen": "response",
    "reward": "all",
    "old_log_prob": "all",
    "ref": "all",
    "teacher": "all",
    "values": "all",
    "adv": "all",
    "update_critic": "all",
    "update_actor": "all",
}


def token_counts(batch: DataProto) -> dict[str, int]:
    response = int(batch.batch["response_mask"].sum())
    total = int(batch.batch["attention_mask"].sum())
    return {"response": response, "prompt": total - response, "all": total}


def compute_timing_metrics(timing: dict[str, float], counts: dict[str, int]) -> dict[str, float]:
    out = {f"timing_s/{name}": seconds for name, seconds in timing.items()}
    for name, basis in _PER_TOKEN_BASIS.items():
        if name in timing and counts[basis] > 0:
            out[f"timing_per_token_ms/{name}"] = timing[name] * 1000.0 / counts[basis]
    return out


def compute_throughput_metrics(timing: dict[str, float], counts: dict[str, int], world_size: int) -> dict[str, float]:
    step = timing.get("step", 0.0)
    out = {"perf/total_num_tokens": float(counts["all"]), "perf/time_per_step": step}
    if step > 0:
        out["perf/throughput"] = counts["all"] / (step * world_size)
    return out


def step_memory_peak(metrics: dict[str, float]) -> dict[str, float]:
    """perf/max_memory_allocated_gb: the largest per-phase peak of the step (veRL's key); absent when no phase
    reported one (CPU)."""
    peaks = [v for k, v in metrics.items() if k.startswith("perf/max_memory_allocated_gb/")]
    return {"perf/max_memory_allocated_gb": max(peaks)} if peaks else {}
