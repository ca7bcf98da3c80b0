"""What the server-mode tests of both engines share: the stand-in installed in the test's process and importable by
the server process, the server's log written under the test's tmp_path (tempfile.tempdir), a free port, a
server-mode context, and the calls the server's engine was asked (its /fake_calls)."""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import tempfile
import urllib.request

from engine_fakes.contexts import make_ctx
from verlx.config.roles import RolloutServerConfig

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VLLM_VERSION, SGLANG_VERSION = "0.26.0", "0.5.23"


def server_ctx(path, port: int, **overrides):
    ctx = make_ctx(str(path), load_format="auto", **overrides)
    ctx.config.server = RolloutServerConfig(enable=True, port=port, startup_timeout_s=60)
    return ctx


def calls(url: str) -> list[list]:
    with urllib.request.urlopen(f"{url}/fake_calls", timeout=10) as response:
        return json.loads(response.read())


def server_log(tmp_path, engine: str, port: int) -> str:
    """Where verlx writes the server's log (tempfile.tempdir is the test's tmp_path: see `served_fake`)."""
    return os.path.join(str(tmp_path), f"verlx_{engine}_server_rank0_port{port}.log")


@contextlib.contextmanager
def served_fake(engine: str, tmp_path, monkeypatch):
    """The engine's stand-in installed here and importable by the server process, for the `with` block; then
    undone, with the multiprocessing start method restored."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    start_method = mp.get_start_method(allow_none=True)
    if engine == "vllm":
        from engine_fakes.fake_vllm import install_fake_vllm
        from engine_fakes.fake_vllm_server import write_importable_package

        monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
        install, version, prefix = install_fake_vllm, VLLM_VERSION, "FAKE_VLLM"
    else:
        from engine_fakes.fake_sglang import install_fake_sglang
        from engine_fakes.fake_sglang_server import write_importable_package

        install, version, prefix = install_fake_sglang, SGLANG_VERSION, "FAKE_SGLANG"
    site = write_importable_package(str(tmp_path / "site"))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([site, TESTS, os.path.dirname(TESTS),
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv(f"{prefix}_VERSION", version)
    monkeypatch.setenv(f"{prefix}_DIST", str(tmp_path / "server_dist"))
    state = install(version, str(tmp_path / "dist"))
    try:
        yield state
    finally:
        state.undo()
        mp.set_start_method(start_method, force=True)
