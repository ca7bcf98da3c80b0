"""Compiled artefacts kept across runs: torch.compile's inductor caches (FX graphs, AOT autograd) and Triton's
kernels, under one directory (trainer.compile_cache_dir, default ~/.cache/verlx/compile).

torch's own defaults put inductor's cache under /tmp (emptied at reboot, per user) and Triton's under ~/.triton;
one named directory survives reboots, can be shared by the nodes of a cluster or carried to a fresh machine, and
is easy to find and clear. What a warm cache saves: inductor's code generation and C++/Triton compilation of every
compiled graph; Dynamo still traces the Python code (seconds) and CUDA graphs are still captured.

Set in every worker process before anything compiles (the workers call it first thing); an environment variable the
user set (TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR) wins, and null leaves torch's defaults alone. Inductor reads its
directory from the environment whenever it needs it, so setting the variable after torch is imported is enough.
"""

from __future__ import annotations

import os

from verlx.utils.paths import expand_path

INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
TRITON_ENV = "TRITON_CACHE_DIR"


def configure_compile_cache(path: str | None) -> dict[str, str] | None:
    """Point inductor's and Triton's caches into `path` and switch inductor's FX-graph and AOT-autograd caches on;
    returns the directories in effect (None: `path` is null, torch's defaults stay)."""
    if path is None:
        return None
    import torch._functorch.config as functorch_config
    import torch._inductor.config as inductor_config
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    root = expand_path(path)
    # importing inductor writes its default into the environment: that value is torch's, not the user's
    unset = (None, "", default_cache_dir())
    dirs = {}
    for env, sub in ((INDUCTOR_ENV, "inductor"), (TRITON_ENV, "triton")):
        if os.environ.get(env) in unset:
            os.environ[env] = os.path.join(root, sub)
        dirs[env] = os.environ[env]
        os.makedirs(dirs[env], exist_ok=True)
    inductor_config.fx_graph_cache = True
    functorch_config.enable_autograd_cache = True
    return dirs


def compile_cache_note(path: str | None) -> list[str]:
    """configure_compile_cache, and the line a worker reports about it (the driver logs it once)."""
    dirs = configure_compile_cache(path)
    if dirs is None:
        return ["trainer.compile_cache_dir=null: torch's own compile caches"]
    return [f"compile caches (trainer.compile_cache_dir): inductor {dirs[INDUCTOR_ENV]}, Triton {dirs[TRITON_ENV]}"]
