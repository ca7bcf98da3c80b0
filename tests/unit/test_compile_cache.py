"""trainer.compile_cache_dir: a second process compiling the same graph finds inductor's FX graph and AOT-autograd
caches there instead of compiling again (CPU inductor, a pointwise function with a backward: the smallest graph that
goes through both caches)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from verlx.utils import compile_cache

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROBE = """
import json, sys
import torch
from verlx.utils.compile_cache import configure_compile_cache
configure_compile_cache(sys.argv[1])
from torch._dynamo.utils import counters
f = torch.compile(lambda x: torch.sin(x) * 2 + x)
f(torch.randn(8, requires_grad=True)).sum().backward()
print(json.dumps({"inductor": dict(counters["inductor"]), "aot": dict(counters["aot_autograd"])}))
"""


def _compile_in_a_new_process(cache: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in (compile_cache.INDUCTOR_ENV, compile_cache.TRITON_ENV)}
    env.update(PYTHONPATH=REPO, OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", PROBE, cache], env=env, capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_second_process_hits_the_persistent_cache(tmp_path):
    cache = str(tmp_path / "compile")
    first = _compile_in_a_new_process(cache)
    assert first["inductor"].get("fxgraph_cache_hit", 0) == 0 and first["inductor"]["fxgraph_cache_miss"] == 2
    assert first["aot"]["autograd_cache_miss"] == 1  # forward and backward graphs, one AOT-autograd entry
    second = _compile_in_a_new_process(cache)
    assert second["inductor"] == {"fxgraph_cache_hit": 2}
    assert second["aot"].get("autograd_cache_hit") == 1 and "autograd_cache_miss" not in second["aot"]
    assert sorted(os.listdir(cache)) == ["inductor", "triton"]
    assert {"fxgraph", "aotautograd"} <= set(os.listdir(os.path.join(cache, "inductor")))


def test_null_leaves_torch_alone_and_the_users_environment_wins(tmp_path, monkeypatch):
    monkeypatch.setenv(compile_cache.INDUCTOR_ENV, str(tmp_path / "mine"))
    monkeypatch.delenv(compile_cache.TRITON_ENV, raising=False)
    assert compile_cache.configure_compile_cache(None) is None
    assert compile_cache.TRITON_ENV not in os.environ
    dirs = compile_cache.configure_compile_cache(str(tmp_path / "verlx"))
    assert dirs == {compile_cache.INDUCTOR_ENV: str(tmp_path / "mine"),
                    compile_cache.TRITON_ENV: str(tmp_path / "verlx" / "triton")}
