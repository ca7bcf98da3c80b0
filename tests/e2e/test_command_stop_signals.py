"""A stop signal to a command without a step loop (main_eval here; main_generation shares the handler through
trainer/entrypoint.py): one message, its reward processes gone, no half-written output, exit 128 + the signal.
Before, SIGTERM ended such a command silently (Python's default) and, once Ray had started, with status 15."""

from __future__ import annotations

import os
import signal
import time

import pyarrow as pa
import pyarrow.parquet as pq

from helpers.stop_signals import send, session_processes, start_in_own_session, wait_gone

HANGING_REWARD = """
import os, time

def hangs(data_source, solution_str, ground_truth, extra_info=None):
    open(os.environ["SCORING_MARKER"], "w").close()
    time.sleep(600)
    return 1.0
"""


def test_sigterm_to_main_eval_stops_it_with_a_message_and_its_scorers(tmp_path, monkeypatch):
    (tmp_path / "reward.py").write_text(HANGING_REWARD)
    rows = [{"data_source": "mine", "prompt": [{"role": "user", "content": "q"}],
             "reward_model": {"style": "rule", "ground_truth": "a"}, "responses": ["a", "b"]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "gen.parquet")
    marker = tmp_path / "scoring"
    monkeypatch.setenv("SCORING_MARKER", str(marker))
    args = [f"data.path={tmp_path / 'gen.parquet'}", f"custom_reward_function.path={tmp_path / 'reward.py'}",
            "custom_reward_function.name=hangs", "reward.num_workers=2", "reward.timeout_s=600"]
    command = start_in_own_session("verlx.trainer.main_eval", args, tmp_path)
    try:
        wait_for_file(marker, command)
        assert len(session_processes(command.pid)) >= 3  # the command and its 2 scorers
        send(command, signal.SIGTERM)
        output = command.communicate(timeout=60)[0]
    finally:
        if command.poll() is None:
            command.kill()
    assert command.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert ("error: stopped on SIGTERM; nothing was written (the report is written once every response is scored)"
            in output), output[-3000:]
    assert "Traceback" not in output
    assert wait_gone(command.pid, timeout_s=10) == []
    assert not os.path.exists(tmp_path / "gen.eval.json")


def wait_for_file(path, proc, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        assert time.monotonic() < deadline, f"{path} was not written in {timeout_s}s"
        time.sleep(0.1)
