"""main_ppo on a two-node Ray cluster started as users start one (`ray start --head`, `ray start --address`), on
CPU: the driver joins it through RAY_ADDRESS, places a worker on each node, checkpoints and resumes; one_step_off
puts the trainer on one node and the rollout group on the other; a node that dies mid-step ends the run with the
node and the phase named, and the next run resumes from the last checkpoint.

Each node has one CPU, so each takes exactly one worker process: placement on both nodes is forced, not chance.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time

import pytest

from helpers.e2e import e2e_overrides, read_metrics
from helpers.ray_cli_cluster import start_cli_cluster
from verlx.trainer import checkpointing

pytestmark = pytest.mark.slow
PLACED = re.compile(r"trainer workers \(actor_rollout_ref\): rank 0 on node \S+ \((\w+)\), "
                    r"rank 1 on node \S+ \((\w+)\)")


@pytest.fixture(scope="module")
def cluster():
    cluster = start_cli_cluster(cpus_per_node=1)
    yield cluster
    cluster.stop()


def run_driver(cluster, tiny_model_dir, data_dir, out_dir, *overrides, wait=True):
    cmd = [sys.executable, "-m", "verlx.trainer.main_ppo",
           *e2e_overrides(tiny_model_dir, data_dir, out_dir, "algorithm.adv_estimator=grpo",
                          "actor_rollout_ref.rollout.n=2", "trainer.nnodes=2", "trainer.n_gpus_per_node=1",
                          "trainer.device=cpu", "trainer.save_freq=1", *overrides)]
    env = {**cluster.env, "RAY_ADDRESS": cluster.address, "OMP_NUM_THREADS": "1"}
    log_path = os.path.join(out_dir, f"driver-{len(os.listdir(out_dir))}.log")
    with open(log_path, "w") as log:
        process = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    if not wait:
        return process, log_path
    process.wait(timeout=600)
    return process.returncode, read(log_path)


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def test_two_nodes_checkpoint_resume(cluster, tiny_model_dir, arithmetic_data_dir, tmp_path):
    rc, log = run_driver(cluster, tiny_model_dir, arithmetic_data_dir, tmp_path, "trainer.total_training_steps=1")
    assert rc == 0, log[-3000:]
    assert f"joining the Ray cluster at {cluster.address} (from the RAY_ADDRESS environment variable)" in log
    ranks = PLACED.search(log)
    assert ranks, log[-3000:]
    assert set(ranks.groups()) == {cluster.node_ids()[n][:12] for n in ("head_node", "worker_node")}
    assert checkpointing.complete_steps(f"{tmp_path}/ckpt") == [1]

    rc, log = run_driver(cluster, tiny_model_dir, arithmetic_data_dir, tmp_path, "trainer.total_training_steps=2")
    assert rc == 0, log[-3000:]
    assert "resumed from" in log and "at step 1" in log
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2]


def test_one_step_off_trainer_and_rollout_group_on_different_nodes(cluster, tiny_model_dir, arithmetic_data_dir,
                                                                   tmp_path):
    rc, log = run_driver(cluster, tiny_model_dir, arithmetic_data_dir, tmp_path, "trainer.nnodes=1",
                         "trainer.rollout_mode=one_step_off", "actor_rollout_ref.hybrid_engine=false",
                         "rollout.nnodes=1", "rollout.n_gpus_per_node=1", "trainer.total_training_steps=2")
    assert rc == 0, log[-3000:]
    trainer_node = re.search(r"trainer workers \(actor_rollout_ref\): rank 0 on node (\S+) \((\w+)\)", log)
    rollout_node = re.search(r"rollout worker group: rank 0 on node \S+ \((\w+)\); weights broadcast from trainer "
                             r"rank 0 \((\S+):\d+\)", log)
    assert trainer_node and rollout_node, log[-3000:]
    assert trainer_node.group(2) != rollout_node.group(1)
    # the rendezvous address is the trainer node's (not 127.0.0.1, which a rollout group on another host cannot reach)
    assert rollout_node.group(2) == trainer_node.group(1)
    rows = read_metrics(tmp_path)
    assert [row["step"] for row in rows] == [1, 2] and rows[1]["timing_s/weight_sync"] >= 0


def test_a_node_dying_mid_step_is_named_and_the_next_run_resumes(cluster, tiny_model_dir, arithmetic_data_dir,
                                                                 tmp_path):
    worker_id = cluster.node_ids()["worker_node"][:12]
    process, log_path = run_driver(
        cluster, tiny_model_dir, arithmetic_data_dir, tmp_path, "trainer.total_training_steps=2",
        "trainer.phase_timeout_s=300", "actor_rollout_ref.rollout.name=helpers.faulty_engines:HangingEngine",
        "+actor_rollout_ref.rollout.engine_kwargs.custom.hang_at_step=2", wait=False)
    deadline = time.monotonic() + 300
    while checkpointing.complete_steps(f"{tmp_path}/ckpt") != [1]:  # step 1 saved: step 2 is under way
        assert process.poll() is None and time.monotonic() < deadline, read(log_path)[-3000:]
        time.sleep(0.5)
    killed = time.monotonic()
    cluster.kill_node("worker_node")
    process.wait(timeout=300)
    elapsed = time.monotonic() - killed
    log = read(log_path)
    assert process.returncode == 1, log[-3000:]
    assert elapsed < 300  # well within the phase timeout: the death is reported, not waited out
    assert re.search(rf"rank \d on node \S+ \({worker_id}\) died during generate_sequences", log), log[-3000:]

    cluster.start_node("worker_node", num_cpus=1)
    rc, log = run_driver(cluster, tiny_model_dir, arithmetic_data_dir, tmp_path, "trainer.total_training_steps=2")
    assert rc == 0, log[-3000:]
    assert "at step 1" in log
    assert [row["step"] for row in read_metrics(tmp_path)] == [1, 2]
