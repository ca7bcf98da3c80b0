"""Fault injection through main_ppo: exact resume, kill -9 with restart, hung phases, stuck rewards, full disks."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from helpers.e2e import e2e_overrides, make_config, read_metrics
from helpers.stop_signals import send, session_processes, start_in_own_session, wait_for_lines, wait_gone
from verlx.single_controller import PhaseTimeoutError, WorkerDiedError
from verlx.trainer import checkpointing
from verlx.trainer.main_ppo import run_ppo
from verlx.utils.errors import StorageError

COMPARED = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "critic/score/mean", "response_length/mean",
            "actor/kl_loss")


GRPO = ("algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.use_kl_loss=true",
        "actor_rollout_ref.actor.entropy_coeff=0.01", "trainer.total_training_steps=4", "trainer.save_freq=2")


def grpo_config(model_dir, data_dir, out_dir, *extra):
    return make_config(model_dir, data_dir, out_dir, *GRPO, *extra)


def last_row(out_dir):
    return read_metrics(out_dir)[-1]


@pytest.fixture(scope="module")
def uninterrupted(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("uninterrupted")
    run_ppo(grpo_config(tiny_model_dir, arithmetic_data_dir, out))
    row = last_row(out)
    assert row["step"] == 4
    return row


def assert_same_final(row, reference):
    assert row["step"] == reference["step"] == 4
    for key in COMPARED:
        assert row[key] == pytest.approx(reference[key], abs=1e-6), key


def test_crash_then_resume_matches_uninterrupted(uninterrupted, tiny_model_dir, arithmetic_data_dir, tmp_path):
    dying = ["actor_rollout_ref.rollout.name=helpers.faulty_engines:DyingOnceEngine",
             "+actor_rollout_ref.rollout.engine_kwargs.custom.die_at_step=3",
             f"+actor_rollout_ref.rollout.engine_kwargs.custom.marker={tmp_path}/died"]
    with pytest.raises(WorkerDiedError) as info:
        run_ppo(grpo_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *dying))
    assert info.value.rank == 0 and info.value.method == "generate_sequences"
    assert checkpointing.complete_steps(f"{tmp_path}/ckpt") == [2]
    run_ppo(grpo_config(tiny_model_dir, arithmetic_data_dir, tmp_path))  # resume_mode=auto
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert_same_final(rows[-1], uninterrupted)


def test_kill9_restarts_workers_and_matches_uninterrupted(uninterrupted, tiny_model_dir, arithmetic_data_dir,
                                                         tmp_path):
    dying = ["actor_rollout_ref.rollout.name=helpers.faulty_engines:DyingOnceEngine",
             "+actor_rollout_ref.rollout.engine_kwargs.custom.die_at_step=3",
             "+actor_rollout_ref.rollout.engine_kwargs.custom.rank=1",
             f"+actor_rollout_ref.rollout.engine_kwargs.custom.marker={tmp_path}/died", "trainer.max_restarts=1"]
    final = run_ppo(grpo_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *dying))
    assert os.path.exists(f"{tmp_path}/died")
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 4]  # step 3 was lost and redone
    assert_same_final({**final, "step": 4}, uninterrupted)


def test_hung_rollout_fires_the_watchdog_with_phase_and_stack(ray_cpu, tiny_model_dir, arithmetic_data_dir,
                                                               tmp_path):
    cfg = grpo_config(tiny_model_dir, arithmetic_data_dir, tmp_path,
                      "actor_rollout_ref.rollout.name=helpers.faulty_engines:HangingEngine",
                      "+actor_rollout_ref.rollout.engine_kwargs.custom.hang_at_step=2",
                      "+trainer.phase_timeouts.generate_sequences=5")
    start = time.monotonic()
    with pytest.raises(PhaseTimeoutError) as info:
        run_ppo(cfg)
    assert time.monotonic() - start < 120
    err = info.value
    assert err.method == "generate_sequences" and err.running_ranks == [0, 1]
    assert "generate" in err.stacks[0] and "faulty_engines" in err.stacks[0]
    assert checkpointing.complete_steps(f"{tmp_path}/ckpt") == []  # nothing half-done was saved


def test_full_disk_keeps_previous_checkpoint_and_resumes_from_it(ray_cpu, tiny_model_dir, arithmetic_data_dir,
                                                                 tmp_path):
    cfg = grpo_config(tiny_model_dir, arithmetic_data_dir, tmp_path,
                      "actor_rollout_ref.rollout.name=helpers.faulty_engines:DiskFullEngine",
                      "+actor_rollout_ref.rollout.engine_kwargs.custom.full_at_step=3")
    with pytest.raises(StorageError) as info:
        run_ppo(cfg)
    root = f"{tmp_path}/ckpt"
    message = str(info.value)  # the path, the OS error, the free space, the checkpoint a resume uses
    assert re.search(rf"^cannot write the actor checkpoint {root}/\.tmp-global_step_4-\S+/actor: No space left on "
                     r"device \(simulated\) \(ENOSPC\); [\d.]+ MiB free on that file system\. ", message), message
    assert f"The last complete checkpoint is {root}/global_step_2 (step 2); running the same command" in message
    assert checkpointing.complete_steps(root) == [2]
    assert checkpointing.missing_files(checkpointing.step_dir(root, 2), use_critic=False) == []
    assert any(name.startswith(".tmp-global_step_4") for name in os.listdir(root))  # the failed write
    run_ppo(grpo_config(tiny_model_dir, arithmetic_data_dir, tmp_path))
    # step 4 failed while saving (a step is logged once its checkpoint is written); 3-4 are redone from step 2
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3, 3, 4]
    assert checkpointing.complete_steps(root) == [2, 4]
    assert not any(name.startswith(".tmp-") for name in os.listdir(root))


def test_stuck_reward_function_is_timed_out_and_counted(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    reward = tmp_path / "reward.py"
    reward.write_text(
        "import time\n"
        "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    if extra_info['index'] % 4 == 0:\n"
        "        time.sleep(10**9)\n"
        "    return 0.5\n"
    )
    cfg = make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                      "actor_rollout_ref.rollout.n=2", f"custom_reward_function.path={reward}",
                      "reward.num_workers=2", "reward.timeout_s=2", "reward.max_error_fraction=0.5",
                      "trainer.test_freq=1")
    start = time.monotonic()
    run_ppo(cfg)
    assert time.monotonic() - start < 90
    (row,) = read_metrics(tmp_path)
    assert row["reward/timeouts"] > 0 and row["reward/errors"] == 0
    assert 0 < row["critic/score/mean"] < 0.5  # timed-out samples scored reward.error_score = 0
    # validation (16 held-out prompts, one sample each): rows 0, 4, 8, 12 hang
    assert row["val-aux/arithmetic/reward/timeouts"] == 4 and row["val-aux/arithmetic/reward/errors"] == 0
    assert row["val-aux/arithmetic/reward/error_rate"] == 0.25


def test_resume_at_an_epoch_boundary_trains_the_next_epoch(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    common = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "data.train_max_samples=16",
              "trainer.save_freq=2", "trainer.total_training_steps=null"]
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *common, "trainer.total_epochs=1"))
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *common, "trainer.total_epochs=2"))
    rows = read_metrics(tmp_path)
    assert [(r["step"], r["training/epoch"]) for r in rows] == [(1, 0), (2, 1), (3, 1), (4, 2)]


def test_resume_with_another_world_size(ray_cpu, tiny_model_dir, arithmetic_data_dir, tmp_path):
    common = ["algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=2", "trainer.save_freq=1"]
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *common, "trainer.total_training_steps=1"))
    run_ppo(make_config(tiny_model_dir, arithmetic_data_dir, tmp_path, *common, "trainer.total_training_steps=2",
                        "trainer.n_gpus_per_node=1"))  # saved by 2 ranks, resharded onto 1
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_sigterm_saves_stops_every_process_and_resume_matches_uninterrupted(uninterrupted, tiny_model_dir,
                                                                           arithmetic_data_dir, tmp_path):
    """SIGTERM to the driver (a scheduler, `kill`): the running step finishes, a checkpoint is saved, the workers,
    the reward scorers and Ray are gone within seconds, the exit code is 143; resuming ends where an
    uninterrupted run does."""
    args = e2e_overrides(tiny_model_dir, arithmetic_data_dir, tmp_path, *GRPO, "reward.num_workers=2")
    driver = start_in_own_session("verlx.trainer.main_ppo", args, tmp_path)
    wait_for_lines(f"{tmp_path}/metrics.jsonl", 1, driver)
    running = session_processes(driver.pid)
    assert len(running) >= 6  # driver, Ray's GCS and raylet, 2 workers, 2 reward scorers (at least)
    send(driver, signal.SIGTERM)
    output = driver.communicate(timeout=180)[0]
    assert driver.returncode == 128 + signal.SIGTERM, output[-4000:]
    assert wait_gone(driver.pid, timeout_s=20) == []
    assert "SIGTERM received: finishing the running step, then saving a checkpoint" in output
    assert "Traceback" not in output and "HYDRA_FULL_ERROR" not in output
    stopped = int(re.search(r"stopped on SIGTERM after step (\d+): its checkpoint is (\S+)\.", output).group(1))
    assert stopped in (1, 2, 3)
    assert checkpointing.complete_steps(f"{tmp_path}/ckpt")[-1] == stopped
    assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, stopped + 1))
    run_ppo(grpo_config(tiny_model_dir, arithmetic_data_dir, tmp_path))
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert_same_final(rows[-1], uninterrupted)
