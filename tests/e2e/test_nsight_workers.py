"""global_profiler.tool=nsys through Ray (CPU): the trainer's worker class is created under Ray's runtime_env nsight
plugin, which starts each worker process as `nsys profile <worker_nsight_options> -o <session>/logs/nsight/...`; a
stand-in `nsys` on PATH logs its command line and runs the worker, whose environment keeps ray.init's variables."""

from __future__ import annotations

import os
import sys

import ray

from runtime_workers import EchoGroup, EchoWorker
from verlx.config.loader import build, load_yaml, to_container
from verlx.config.schema import PPOConfig
from verlx.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
from verlx.trainer.ppo_trainer import trainer_worker_class
from verlx.workers.profile_plan import worker_nsight_options

NSYS_KEYS = ["global_profiler.tool=nsys", "global_profiler.steps=[1,2]", "actor_rollout_ref.actor.profiler.enable=True",
             "global_profiler.global_tool_config.nsys.worker_nsight_options.cuda-memory-usage=false"]

# what `nsys profile` is given before the program it profiles: options, then -o <report>
STAND_IN_NSYS = """#!/bin/sh
echo "$@" >> {log}
shift
while [ $# -gt 0 ]; do
  case "$1" in
    --*) shift ;;
    -o) shift 2 ;;
    *) break ;;
  esac
done
exec "$@"
"""


def test_the_trainer_workers_start_under_nsys_profile_with_the_worker_options(tmp_path, monkeypatch):
    log = tmp_path / "nsys.log"
    (tmp_path / "nsys").write_text(STAND_IN_NSYS.format(log=log))
    (tmp_path / "nsys").chmod(0o755)
    # the stand-in runs the worker's command as Ray gives it, `python ...` found on PATH: this interpreter's (a venv
    # not activated would otherwise start workers without Ray, retried for minutes)
    monkeypatch.setenv("PATH", os.pathsep.join([str(tmp_path), os.path.dirname(sys.executable), os.environ["PATH"]]))
    ray.init(address="local", num_cpus=2, num_gpus=0, include_dashboard=False,
             runtime_env={"env_vars": {"FROM_RAY_INIT": "kept"}})
    config = build(PPOConfig, to_container(load_yaml(overrides=NSYS_KEYS)))
    try:
        session = ray._private.worker.global_worker.node.get_session_dir_path()
        workers = trainer_worker_class(config, {"echo": RayClassWithInitArgs(EchoWorker)})
        group = RayWorkerGroup(RayResourcePool([2], use_gpu=False), workers, name="nsys")
        view = group.spawn({"echo": (EchoGroup, EchoWorker)})["echo"]
        assert view.environment(["RANK", "FROM_RAY_INIT"]) == [["0", "kept"], ["1", "kept"]]
        group.shutdown()
    finally:
        ray.shutdown()
    launches = [line.split() for line in log.read_text().splitlines() if "default_worker.py" in line]
    assert len(launches) == 2
    for words in launches:
        report = words.index("-o")
        options = dict(word[2:].split("=", 1) for word in words[1:report])
        assert words[0] == "profile" and options == worker_nsight_options(config)
        assert options["capture-range"] == "cudaProfilerApi" and options["cuda-memory-usage"] == "false"
        assert words[report + 1] == f"{session}/logs/nsight/worker_process_%p"
