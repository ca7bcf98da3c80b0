"""Compatibility rows of veRL's generation.yaml (main_generation) and evaluation.yaml (main_eval)."""

from __future__ import annotations

from verlx.config.legacy_keys import Ignored, Refused

TARGET = Ignored("**._target_", "veRL's dataclass for the section; verlx builds its own typed config", quiet=True)

GENERATION = [
    TARGET,
    Refused("rollout.data_parallel_size", "data-parallel rollout engines (one engine spanning several data-parallel "
            "ranks)", inert=(None, 1)),
    Ignored("actor", "main_generation loads no actor: the engine reads the weights from model.path"),
]

EVALUATION = [
    TARGET,
    Ignored("ray_kwargs", "main_eval scores in a local process pool (verlx.reward), not on Ray"),
]
