"""The end of a run: main_ppo starts its private Ray instance with the stop signals blocked (a signal to the process
group reaches only the driver), so Ray's own shutdown cannot end its processes with SIGTERM and waited a second for
each before SIGKILL. shutdown_ray ends Ray's helper programs first; Ray's processes are all gone afterwards, and a
child of the driver that is not Ray's (a reward function's process pool) is left alone."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import json, subprocess, sys
    import psutil, ray
    from verlx.trainer.ray_startup import shutdown_ray
    from verlx.trainer.stop_signals import STOP_SIGNALS, signals_blocked_in_children

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with signals_blocked_in_children(STOP_SIGNALS):
        # "local": a new instance, never the `ray start` cluster test_ray_cluster.py may have up in the other
        # pytest worker (a bare ray.init joins it: "num_cpus and num_gpus must not be provided", CI 2026-11-27)
        ray.init(address="local", num_cpus=1, include_dashboard=True)
    ray_pids = [p.pid for p in psutil.Process().children(recursive=True) if p.pid != bystander.pid]
    shutdown_ray()
    alive = [pid for pid in ray_pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != "zombie"]
    print(json.dumps({"ray_processes": len(ray_pids), "ray_alive": alive,
                      "bystander_alive": bystander.poll() is None, "ray_initialized": ray.is_initialized()}))
    bystander.kill()
""")


def test_shutdown_ends_every_ray_process_and_leaves_other_children():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["ray_processes"] >= 3  # raylet, GCS and Ray's Python helpers at least
    assert result["ray_alive"] == [] and result["ray_initialized"] is False
    assert result["bystander_alive"] is True
