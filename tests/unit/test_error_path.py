"""One error path (verlx.utils.errors): user-facing exceptions share VerlxError, entry points report them once as a
message and an exit code, anything else gets its traceback written to a file; storage errors name the path."""

from __future__ import annotations

import errno
import os
import re

import pytest
import torch

from verlx.config.loader import ConfigError, DataError
from verlx.reward.managers import RewardFailure
from verlx.single_controller.errors import PhaseTimeoutError, WorkerCallError, WorkerDiedError, exception_lines
from verlx.trainer.invariants import InvariantError
from verlx.trainer.resume import NothingToDo, ResumeRefused
from verlx.trainer.stop_signals import Interrupted
from verlx.utils.errors import (
    InputError,
    StorageError,
    VerlxError,
    describe_os_error,
    input_errors,
    is_storage_error,
    reported_errors,
    storage_errors,
)
from verlx.utils.registry import UnknownNameError
from verlx.workers.guarded_step import NonFiniteUpdates

REMOTE = """Traceback (most recent call last):
  File "/x/worker.py", line 12, in update_actor
    optimizer = AdamW(params, lr=lr)
                ^^^^^^^^^^^^^^^^^^^^
ValueError: Invalid learning rate: -0.001
while the actor of rank 0 was updating (step 1)"""


def exit_of(error: BaseException, capsys) -> tuple[int, str]:
    with pytest.raises(SystemExit) as info, reported_errors():
        raise error
    return info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("error, code", [
    (ConfigError(["a.b=1 must be >= 2"]), 2), (DataError("f.parquet row 3: bad"), 2),
    (UnknownNameError("unknown x"), 2), (ResumeRefused("/ckpt", ["k: 1 in the checkpoint, 2 now"]), 2),
    (NothingToDo("nothing to do"), 1), (InvariantError("broken"), 1), (RewardFailure("rewards"), 1),
    (NonFiniteUpdates("nan"), 1), (WorkerDiedError("actor", "generate", 1, "killed"), 1),
    (Interrupted(15, "stopped on SIGTERM"), 143), (Interrupted(2, "stopped on SIGINT"), 130),
])
def test_every_user_facing_error_is_a_verlx_error_with_its_exit_code(error, code, capsys):
    assert isinstance(error, VerlxError)
    assert isinstance(error, ValueError) == isinstance(error, (ConfigError, DataError))  # old `except` clauses hold
    exit_code, err = exit_of(error, capsys)
    assert exit_code == code
    assert err.startswith(f"error: {error}") and "Traceback" not in err


def test_a_worker_traceback_goes_to_a_file_and_the_message_keeps_its_exception_lines(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERLX_ERROR_DIR", str(tmp_path))
    code, err = exit_of(WorkerCallError("actor_rollout_ref", "update_actor", 0, REMOTE), capsys)
    assert code == 1
    assert err.startswith("error: actor_rollout_ref.update_actor failed on rank 0: ValueError: Invalid learning rate: "
                          "-0.001\nwhile the actor of rank 0 was updating (step 1)\n(the full traceback is in ")
    assert "Traceback" not in err
    (written,) = tmp_path.iterdir()
    assert str(written) in err and written.read_text() == REMOTE


def test_a_verlx_error_raised_in_a_worker_keeps_its_message_and_exit_code(capsys):
    call = WorkerCallError("actor_rollout_ref", "save_checkpoint", 1, REMOTE)
    call.__cause__ = StorageError("cannot write the actor checkpoint /c: No space left on device (ENOSPC).")
    assert call.exit_code == 1
    assert call.summary() == ("actor_rollout_ref.save_checkpoint failed on rank 1: cannot write the actor checkpoint "
                              "/c: No space left on device (ENOSPC).")
    call.__cause__ = ConfigError(["x=1 is wrong"])
    assert call.exit_code == 2


def test_exception_lines_of_a_formatted_traceback():
    assert exception_lines(REMOTE) == ("ValueError: Invalid learning rate: -0.001\n"
                                       "while the actor of rank 0 was updating (step 1)")
    assert exception_lines("RuntimeError: no frames") == "RuntimeError: no frames"


def test_a_phase_timeout_prints_one_line_and_files_the_stacks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERLX_ERROR_DIR", str(tmp_path))
    code, err = exit_of(PhaseTimeoutError("actor", "generate_sequences", 5, [0, 1], {0: "STACK0"}), capsys)
    assert code == 1 and err.startswith("error: actor.generate_sequences did not finish within 5s")
    assert "STACK0" not in err and "STACK0" in next(tmp_path.iterdir()).read_text()


@pytest.mark.parametrize("handler_error, code, message", [
    (Interrupted(2, "stopped at once on a second signal (SIGINT)"), 130,
     "error: stopped at once on a second signal (SIGINT)\n"),
    (KeyboardInterrupt(), 130, "interrupted (SIGINT)\n"),
])
def test_a_signal_handlers_error_raised_inside_ray_wait_is_reported_as_itself(handler_error, code, message, capsys):
    """Ray's ray.wait checks for signals in Cython: the handler's exception comes out as SystemError("<cyfunction
    CoreWorker.wait> returned a result with an exception set") caused by it (seen 2026-11-26: exit 1 and an
    'unexpected' traceback file instead of the stop message and 128 + the signal)."""
    from_ray_wait = SystemError("<cyfunction CoreWorker.wait> returned a result with an exception set")
    from_ray_wait.__cause__ = handler_error
    assert exit_of(from_ray_wait, capsys) == (code, message)


def test_an_unexpected_error_names_its_traceback_file(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VERLX_ERROR_DIR", str(tmp_path))
    code, err = exit_of(ZeroDivisionError("division by zero"), capsys)
    assert code == 1
    (written,) = tmp_path.iterdir()
    assert err == (f"error: ZeroDivisionError: division by zero\n(unexpected: the traceback is in {written}; "
                   "VERLX_DEBUG=1 prints it here. If your input is fine, please report it with that file)\n")
    assert "Traceback (most recent call last)" in written.read_text()


def test_verlx_debug_lets_the_traceback_through(monkeypatch):
    monkeypatch.setenv("VERLX_DEBUG", "1")
    with pytest.raises(ZeroDivisionError), reported_errors():
        raise ZeroDivisionError("x")


def test_python_errors_while_checking_the_input_are_input_errors(capsys):
    with pytest.raises(InputError) as info, input_errors("found checking the input"):
        raise KeyError("the reward batch needs 'x'")
    assert str(info.value) == "the reward batch needs 'x' (found checking the input; KeyError)"
    assert info.value.exit_code == 2 and "raise KeyError" in info.value.details()
    with pytest.raises(ZeroDivisionError), input_errors("x"):  # not an input problem: left as it is
        raise ZeroDivisionError


def test_torch_writing_to_a_full_disk_becomes_a_storage_error_naming_the_path():
    with pytest.raises(RuntimeError) as raw:  # /dev/full: every write fails with ENOSPC, as on a full disk
        torch.save({"w": torch.zeros(1000)}, "/dev/full")
    assert is_storage_error(raw.value) and "unexpected pos" in str(raw.value)
    with pytest.raises(StorageError) as info, storage_errors("the checkpoint", "/dev/full", "Free space"):
        torch.save({"w": torch.zeros(1000)}, "/dev/full")
    message = str(info.value)
    assert message.startswith("cannot write the checkpoint /dev/full: a write came up short ([enforce fail at ")
    assert "as it does when the disk is full or a quota is reached; " in message and message.endswith(". Free space")


def test_os_errors_are_named_with_their_errno():
    assert describe_os_error(OSError(errno.ENOSPC, "No space left on device")) == "No space left on device (ENOSPC)"
    assert describe_os_error(PermissionError(errno.EACCES, "Permission denied")) == "Permission denied (EACCES)"
    with pytest.raises(StorageError, match=r"^cannot write the metrics /m\.jsonl: Disk quota exceeded \(EDQUOT\); "):
        with storage_errors("the metrics", "/m.jsonl"):
            raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    with pytest.raises(KeyError), storage_errors("x", "/y"):  # not a storage problem: left as it is
        raise KeyError("k")


def test_metrics_and_generation_dumps_on_a_full_disk_name_the_file(tmp_path):
    """Real ENOSPC: the files are links to /dev/full, where every write fails as on a full disk."""
    from verlx.trainer.generation_dump import write_jsonl
    from verlx.utils.tracking import JsonlLogger

    os.symlink("/dev/full", tmp_path / "metrics.jsonl")
    metrics = JsonlLogger("p", "e", {}, str(tmp_path))
    with pytest.raises(StorageError) as info:
        metrics.log({"actor/pg_loss": 0.5}, step=1)
    metrics.finish()
    assert re.fullmatch(rf"cannot write the metrics {tmp_path}/metrics\.jsonl: No space left on device \(ENOSPC\); "
                        r"[\d.]+ MiB free on that file system\. Free space, or set trainer\.output_dir elsewhere",
                        str(info.value)), str(info.value)

    dump = tmp_path / "dump" / "3.jsonl"
    dump.parent.mkdir()
    os.symlink("/dev/full", f"{dump}.tmp")
    with pytest.raises(StorageError, match=rf"^cannot write the generation dump {dump}: No space left on device "):
        write_jsonl(str(dump), [{"response": "x" * 100}])
    assert not dump.exists()  # never a half-written dump under the real name
