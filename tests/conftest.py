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

from engine_fakes.fixtures import fake_sglang, undo  # noqa: E402,F401 - fixtures for the fake-engine tests
from helpers.megatron_cpu import megatron_on_cpu  # noqa: E402,F401 - a fixture for the megatron tests

#: whether the Ray that `ray_cpu` started is up, and the test files that use `ray_cpu` (set at collection)
_shared_ray: dict = {"up": False, "modules": set()}


def pytest_collection_modifyitems(config, items):
    import torch

    _shared_ray["modules"] = {item.path for item in items if "ray_cpu" in getattr(item, "fixturenames", ())}
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; none is visible on this machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def ray_cpu():
    """A local Ray instance (CPU only, more logical CPUs than cores so groups fit), started once for consecutive test
    modules that ask for it rather than once per module (each start is seconds of the 2-core CI). A module finds it
    with every CPU free, or gets a fresh one (an earlier module left an actor or placement group alive); a module that
    does not ask for it sees no Ray of the suite (pytest_runtest_setup), as before."""
    import ray

    if not (_shared_ray["up"] and _all_cpus_free(ray)):
        _stop_shared_ray()
        if ray.is_initialized():
            ray.shutdown()
        # "local": a new instance, never a `ray start` cluster of this host (test_ray_cluster.py starts one, and
        # with pytest-xdist it may be up in the other process)
        ray.init(address="local", num_cpus=8, num_gpus=0, include_dashboard=False, log_to_driver=True)
        _shared_ray["up"] = True
    yield ray


def _all_cpus_free(ray, wait_s: float = 10.0) -> bool:
    """Every CPU of the instance back: the module's actors are gone once their last handle is (a collected cycle may
    hold one), and return their CPUs a moment later."""
    import gc
    import time

    if not ray.is_initialized():
        return False
    gc.collect()
    deadline = time.monotonic() + wait_s
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _stop_shared_ray() -> None:
    import ray

    if _shared_ray["up"] and ray.is_initialized():
        ray.shutdown()
    _shared_ray["up"] = False


def pytest_runtest_setup(item):
    """A test of a module that does not use `ray_cpu` runs with no Ray of the suite up (its own run starts a private
    instance with its own settings, as a user's does)."""
    if _shared_ray["up"] and item.path not in _shared_ray["modules"]:
        _stop_shared_ray()


def pytest_sessionfinish(session, exitstatus):
    _stop_shared_ray()


@pytest.fixture(scope="session", autouse=True)
def fake_engine_scratch(tmp_path_factory):
    """The fake engines' files (helpers/fake_engines.py) under pytest's temporary directory, which pytest prunes,
    rather than left in /tmp by the killed Ray workers that wrote them; set before any Ray instance starts, whose
    workers inherit it."""
    from helpers.fake_engines import SCRATCH_ENV

    os.environ[SCRATCH_ENV] = str(tmp_path_factory.mktemp("fake_engines"))
    yield os.environ[SCRATCH_ENV]
    del os.environ[SCRATCH_ENV]


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Qwen2 with a character-level tokenizer, saved with save_pretrained (random weights)."""
    from helpers.tiny_tokenizer import save_tiny_qwen2

    return save_tiny_qwen2(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tiny_reward_model_dir(tmp_path_factory):
    """A 2-layer Qwen2ForSequenceClassification (one label) on the same tokenizer, with a plain "role: content"
    chat template unlike the policy's ChatML (so the reward model re-templates)."""
    from helpers.tiny_tokenizer import save_tiny_reward_model

    return save_tiny_reward_model(tmp_path_factory.mktemp("tiny_reward_model"))


@pytest.fixture(scope="session")
def arithmetic_data_dir(tmp_path_factory):
    """Real parquet files from the project's arithmetic preprocessing script."""
    import subprocess

    out = tmp_path_factory.mktemp("arithmetic")
    subprocess.run([sys.executable, os.path.join(REPO_DIR, "examples/data_preprocess/arithmetic.py"),
                    "--local_save_dir", str(out), "--test_size", "16", "--train_size", "64"],
                   check=True, capture_output=True)
    return str(out)


@pytest.fixture(scope="module")
def two_node_cluster():
    """A simulated 2-node Ray cluster: two raylets on this machine, 2 CPUs each; the driver is connected to it."""
    import ray
    from ray.cluster_utils import Cluster

    if ray.is_initialized():
        ray.shutdown()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2, "include_dashboard": False})
    cluster.add_node(num_cpus=2)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


@pytest.fixture
def one_rank(monkeypatch):
    """This process as a one-rank torch.distributed world (env:// on a free port), torn down after the test."""
    import torch.distributed as dist

    from verlx.utils.distributed import free_port

    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(free_port())}.items():
        monkeypatch.setenv(key, value)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture
def one_thread():
    """Tiny matmuls: one thread is faster and immune to other processes competing for the 2 cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
