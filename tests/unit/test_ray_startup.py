"""Which Ray a run uses: the cluster it is pointed at (ray_kwargs.ray_init.address, else RAY_ADDRESS), joined without
resource arguments (Ray refuses num_cpus when connecting: "num_cpus and num_gpus must not be provided"), or a
private instance ("local": never a `ray start` cluster found on this machine). tests/e2e/test_ray_cluster.py runs
the real thing against a `ray start` cluster."""

from __future__ import annotations

import logging
import signal
import sys

import pytest

from helpers.e2e import make_config
from verlx.rollout.engine_layout import PORTS_PER_ENGINE
from verlx.rollout.engine_ports import BASE_PORT_ENV, SEARCH_END, SEARCH_START, free_base_port, port_is_free
from verlx.trainer.ray_startup import start_ray
from verlx.trainer.stop_signals import stop_at_once


@pytest.fixture
def ray_init_calls(monkeypatch):
    import ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def _config(tmp_path, *overrides):
    return make_config(tmp_path, tmp_path, tmp_path, "trainer.n_gpus_per_node=3", *overrides)


def test_private_instance_when_not_pointed_at_a_cluster(ray_init_calls, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="verlx"):
        start_ray(_config(tmp_path, "ray_kwargs.ray_init.num_cpus=5"), use_gpu=False)
    (kwargs,) = ray_init_calls
    assert kwargs["address"] == "local" and kwargs["num_cpus"] == 5
    assert "starting a private Ray instance with 5 CPUs" in caplog.text


@pytest.mark.parametrize("source", ["env", "key"])
def test_joining_passes_no_resources_and_says_where_the_address_came_from(ray_init_calls, tmp_path, caplog,
                                                                         monkeypatch, source):
    overrides = ["ray_kwargs.ray_init.num_cpus=5"]
    if source == "env":
        monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    else:
        overrides.append("ray_kwargs.ray_init.address=10.0.0.1:6379")
    with caplog.at_level(logging.INFO, logger="verlx"):
        start_ray(_config(tmp_path, *overrides), use_gpu=True)
    (kwargs,) = ray_init_calls
    assert kwargs["address"] == "10.0.0.1:6379" and "num_cpus" not in kwargs and "num_gpus" not in kwargs
    origin = "the RAY_ADDRESS environment variable" if source == "env" else "ray_kwargs.ray_init.address"
    assert f"joining the Ray cluster at 10.0.0.1:6379 (from {origin})" in caplog.text
    assert "ray_kwargs.ray_init.num_cpus=5 is ignored" in caplog.text


def test_the_commands_sigterm_handler_survives_ray_init(ray_init_calls, monkeypatch, tmp_path):
    """ray.init installs sys.exit(15) for SIGTERM (a silent exit 15); the command's handler must stay."""
    import ray

    def ray_init(**kwargs):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))  # as ray.init does
        ray_init_calls.append(kwargs)

    monkeypatch.setattr(ray, "init", ray_init)
    with stop_at_once():
        own = signal.getsignal(signal.SIGTERM)
        start_ray(_config(tmp_path), use_gpu=False)
        assert signal.getsignal(signal.SIGTERM) is own and len(ray_init_calls) == 1


def test_engine_base_port_is_a_free_block_unless_the_user_set_one(ray_init_calls, tmp_path, monkeypatch):
    """Two runs on one host once both took ports 30000.. and the second's SGLang failed on EADDRINUSE: the workers
    get a base port whose whole block (3 workers × PORTS_PER_ENGINE) is free here; a base the user set wins."""
    monkeypatch.delenv(BASE_PORT_ENV, raising=False)
    start_ray(_config(tmp_path), use_gpu=False)
    base = int(ray_init_calls[-1]["runtime_env"]["env_vars"][BASE_PORT_ENV])
    assert all(port_is_free(p) for p in range(base, base + 3 * PORTS_PER_ENGINE))
    monkeypatch.setenv(BASE_PORT_ENV, "41000")
    start_ray(_config(tmp_path), use_gpu=False)
    assert ray_init_calls[-1]["runtime_env"]["env_vars"][BASE_PORT_ENV] == "41000"
    start_ray(_config(tmp_path, f"+ray_kwargs.ray_init.runtime_env.env_vars.{BASE_PORT_ENV}=42000"), use_gpu=False)
    assert ray_init_calls[-1]["runtime_env"]["env_vars"][BASE_PORT_ENV] == "42000"


def test_a_block_with_a_busy_port_is_skipped():
    """The search starts at a random block; a block where one port is taken is passed over for the next, and a
    port something listens on is seen as taken."""
    import random
    import socket

    span = 2 * PORTS_PER_ENGINE
    first = SEARCH_START + random.Random(7).randrange(len(range(SEARCH_START, SEARCH_END - span + 1, span))) * span
    assert free_base_port(2, random.Random(7), is_free=lambda port: True) == first
    assert free_base_port(2, random.Random(7), is_free=lambda port: port != first + 5) == first + span
    with pytest.raises(RuntimeError, match=f"set {BASE_PORT_ENV} to the first of {span} free ports"):
        free_base_port(2, random.Random(7), is_free=lambda port: False)
    with socket.socket() as listener:
        listener.bind(("", 0))
        listener.listen()
        assert not port_is_free(listener.getsockname()[1])
