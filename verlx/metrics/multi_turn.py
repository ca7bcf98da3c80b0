"""The agent loop's per-step metrics, computed from the per-sample `multi_turn_*` columns of the whole batch (exact
over all ranks; rollout/agent/runner.py writes them)."""

from __future__ import annotations

import collections

import numpy as np


def multi_turn_metrics(batch) -> dict[str, float]:
    """multi_turn/num_turns/{mean,max,min}, multi_turn/user_turns/mean, tool/calls/mean, tool/call_rate,
    tool/errors, tool/timeouts, tool/malformed, tool/truncated, tool/latency_s (mean per call),
    multi_turn/template_mismatch, multi_turn/template_rewrite, multi_turn/stop_reason/<reason> (fraction of
    samples)."""
    nt = batch.non_tensor_batch
    if "multi_turn_num_turns" not in nt:
        return {}
    column = {k: np.asarray(nt[f"multi_turn_{k}"], dtype=np.float64) for k in
              ("num_turns", "tool_calls", "tool_errors", "tool_timeouts", "tool_malformed", "tool_truncated",
               "tool_latency_s", "template_mismatch", "template_rewrite")}
    calls = column["tool_calls"]
    timed = calls - column["tool_malformed"]
    metrics = {
        "multi_turn/num_turns/mean": float(column["num_turns"].mean()),
        "multi_turn/num_turns/max": float(column["num_turns"].max()),
        "multi_turn/num_turns/min": float(column["num_turns"].min()),
        "tool/calls/mean": float(calls.mean()),
        "tool/call_rate": float((calls > 0).mean()),
        "tool/errors": float(column["tool_errors"].sum()),
        "tool/timeouts": float(column["tool_timeouts"].sum()),
        "tool/malformed": float(column["tool_malformed"].sum()),
        "tool/truncated": float(column["tool_truncated"].sum()),
        "tool/latency_s": float(column["tool_latency_s"].sum() / timed.sum()) if timed.sum() else 0.0,
        "multi_turn/template_mismatch": float(column["template_mismatch"].sum()),
        "multi_turn/template_rewrite": float(column["template_rewrite"].sum()),
    }
    if "multi_turn_user_turns" in nt:
        metrics["multi_turn/user_turns/mean"] = float(np.asarray(nt["multi_turn_user_turns"], np.float64).mean())
    reasons = collections.Counter(str(r) for r in nt["multi_turn_stop_reason"])
    for reason, count in reasons.items():
        metrics[f"multi_turn/stop_reason/{reason}"] = count / len(calls)
    return metrics
