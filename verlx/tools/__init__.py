"""Command-line tools around a run's outputs (plotting metrics.jsonl, ...)."""
