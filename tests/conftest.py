"""Shared fixtures. Ray workers import test helper modules, so the tests folder goes on their PYTHONPATH."""

from __future__ import annotations

import os
import sys

import pytest

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TESTS_DIR)
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [TESTS_DIR, REPO_DIR, os.environ.get("PYTHONPATH", "")] if p
)
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path[:0] = [REPO_DIR, TESTS_DIR]


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def ray_cpu():
    """A local Ray instance for one test module (CPU only, more logical CPUs than cores so groups fit)."""
    import ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=8, num_gpus=0, include_dashboard=False, log_to_driver=True)
    yield ray
    ray.shutdown()
