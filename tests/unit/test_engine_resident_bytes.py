"""The sleeping engine's device memory measured at start-up: a fall in memory in use (another process, or cached
blocks freed by the engine's start-up) is said and not reported as a negative size (issue 23's reward-model run on
an H100 logged rollout/engine_asleep_gb = -0.547 before the fix)."""

import logging

from verlx.workers.actor_rollout_ref_worker import engine_resident_bytes

GIB = 2**30


def test_the_growth_in_use_is_the_engines():
    assert engine_resident_bytes(3 * GIB, 4 * GIB + 512) == GIB + 512
    assert engine_resident_bytes(5 * GIB, 5 * GIB) == 0


def test_a_fall_in_use_is_no_size_and_is_said(caplog):
    with caplog.at_level(logging.WARNING, logger="verlx.workers.actor_rollout_ref_worker"):
        assert engine_resident_bytes(int(10.5 * GIB), 10 * GIB) is None
    assert "fell from 10.50 to 10.00 GiB" in caplog.text
    assert "rollout/engine_asleep_gb is not reported" in caplog.text
