"""Stop signals and the run lock, through the real commands: a second run on a busy checkpoint directory is refused
naming the first; a second signal stops at once; SFT saves the model trained so far (docs/troubleshooting.md).
SIGTERM with a checkpoint and an exact resume: tests/e2e/test_fault_tolerance.py."""

from __future__ import annotations

import os
import re
import signal
import socket

from arithmetic_rows import disjoint_pairs, write_arithmetic
from helpers.commands import run_module
from helpers.e2e import e2e_overrides, read_metrics
from helpers.stop_signals import send, start_in_own_session, wait_for_lines, wait_gone
from verlx.models.tiny import save_tiny_model
from verlx.trainer import checkpointing
from verlx.trainer.run_lock import LOCK_NAME


def test_a_second_run_is_refused_and_a_second_signal_stops_at_once(tiny_model_dir, arithmetic_data_dir, tmp_path):
    # steps it cannot finish before the signals (50 took 13.5 s after step 1 on a quiet machine; a loaded one can
    # spend that long refusing the second run, and a finished run ends on the signals outside its step loop)
    args = e2e_overrides(tiny_model_dir, arithmetic_data_dir, tmp_path, "algorithm.adv_estimator=grpo",
                         "actor_rollout_ref.rollout.n=2", "trainer.total_training_steps=100000",
                         "reward.num_workers=2")
    first = start_in_own_session("verlx.trainer.main_ppo", args, tmp_path)
    wait_for_lines(f"{tmp_path}/metrics.jsonl", 1, first)

    second = run_module([*args, f"trainer.output_dir={tmp_path}/second"], cwd=tmp_path)
    assert second.returncode == 2, second.stderr[-3000:]
    assert (f"error: trainer.default_local_dir={tmp_path}/ckpt is in use by another run: pid {first.pid} on host "
            f"{socket.gethostname()}, started ") in second.stderr
    assert "Traceback" not in second.stderr and "Started a local Ray" not in second.stderr

    # as a terminal's hang-up then Ctrl-C reach the whole process group: the second signal does not wait for the save
    send(first, signal.SIGHUP, signal.SIGINT, to_group=True)
    output = first.communicate(timeout=120)[0]
    assert first.returncode == 128 + signal.SIGINT, output[-4000:]
    assert wait_gone(first.pid, timeout_s=20) == []
    assert "SIGHUP received: finishing the running step" in output
    saved = checkpointing.complete_steps(f"{tmp_path}/ckpt")
    last = (f"The last complete checkpoint is {tmp_path}/ckpt/global_step_{saved[-1]}" if saved else
            f"No checkpoint is complete in trainer.default_local_dir={tmp_path}/ckpt yet")
    assert re.search(r"error: stopped at once on a second signal \(SIGINT\); the save that SIGHUP asked for did not "
                     r"happen\. " + re.escape(last), output), output[-3000:]
    assert "Traceback" not in output
    assert not os.path.exists(f"{tmp_path}/ckpt/{LOCK_NAME}")  # released: the next run needs no clean-up


def test_sft_saves_the_model_trained_so_far_on_sigterm(tmp_path):
    model = save_tiny_model(str(tmp_path / "tiny"), seed=0)
    train, test = disjoint_pairs(256, 32, seed=1)
    train_file = write_arithmetic(str(tmp_path / "train.parquet"), train, "train")
    out, logs = tmp_path / "sft", tmp_path / "logs"
    args = [f"data.train_files={train_file}", "data.val_files=null", f"model.partial_pretrain={model}",
            f"trainer.default_local_dir={out}", f"trainer.output_dir={logs}", "trainer.total_training_steps=500",
            "trainer.log_freq=1", "data.train_batch_size=16", "data.micro_batch_size_per_gpu=16",
            "trainer.test_freq=-1", "trainer.target_val_accuracy=null"]
    sft = start_in_own_session("verlx.trainer.main_sft", args, tmp_path)
    wait_for_lines(f"{logs}/metrics.jsonl", 2, sft)
    send(sft, signal.SIGTERM)
    output = sft.communicate(timeout=120)[0]
    assert sft.returncode == 128 + signal.SIGTERM, output[-4000:]
    assert wait_gone(sft.pid, timeout_s=10) == []
    step = int(re.search(rf"error: stopped on SIGTERM after step (\d+) of 500: the model trained so far is saved in "
                         rf"{re.escape(str(out))} ", output).group(1))
    assert [r["step"] for r in read_metrics(logs)] == list(range(1, step + 1))
    assert os.path.isfile(out / "config.json") and os.path.isfile(out / "model.safetensors")
    assert "Traceback" not in output
