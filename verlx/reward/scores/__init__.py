"""Built-in rule scores by data_source. Importing this package registers them all."""

from verlx.reward.scores import geo3k, gsm8k, math  # noqa: F401  (registration)
from verlx.reward.scores.registry import SCORE_FUNCTIONS, default_compute_score, register_score

__all__ = ["SCORE_FUNCTIONS", "default_compute_score", "register_score"]
