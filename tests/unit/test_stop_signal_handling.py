"""The driver's signal handling (verlx.trainer.stop_signals) in this process: the first signal waits for the safe
point, a second one or a missed deadline stops at once, outside the step loop there is nothing to wait for."""

from __future__ import annotations

import os
import signal
import time

import pytest

from verlx.trainer.stop_signals import STOP_SIGNALS, Interrupted, StopSignals, stop_at_once


def stops(save=True, timeout_s=None) -> StopSignals:
    return StopSignals(save, timeout_s, lambda: "The last complete checkpoint is /c/global_step_3 (step 3).")


def deliver(signum: int) -> None:
    os.kill(os.getpid(), signum)
    time.sleep(0.05)  # the handler runs in the main thread at its next bytecode


def test_the_first_signal_waits_for_the_safe_point_and_names_the_checkpoint(caplog):
    before = signal.getsignal(signal.SIGTERM)  # not SIG_DFL after a test that ran ray.init in this process
    with stops() as stop, stop.step_loop():
        deliver(signal.SIGTERM)
        assert stop.requested and stop.signum == signal.SIGTERM
        with pytest.raises(Interrupted) as info:
            stop.stop_point(4, None, lambda: "/c/global_step_4")
    assert info.value.exit_code == 143
    assert str(info.value) == ("stopped on SIGTERM after step 4: its checkpoint is /c/global_step_4. Run the same "
                               "command again to resume from it (trainer.resume_mode=auto)")
    assert "SIGTERM received: finishing the running step, then saving a checkpoint and stopping" in caplog.text
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handlers are back


def test_without_a_signal_the_safe_point_does_nothing():
    with stops() as stop, stop.step_loop():
        stop.stop_point(1, None, lambda: pytest.fail("saved without a signal"))


def test_a_second_signal_stops_at_once():
    with stops() as stop, stop.step_loop():
        deliver(signal.SIGHUP)
        with pytest.raises(Interrupted) as info:
            deliver(signal.SIGINT)
    assert info.value.exit_code == 130
    assert str(info.value) == ("stopped at once on a second signal (SIGINT); the save that SIGHUP asked for did not "
                               "happen. The last complete checkpoint is /c/global_step_3 (step 3).")


@pytest.mark.parametrize("save", [True, False])
def test_outside_the_step_loop_or_without_saving_the_first_signal_stops_at_once(save):
    with stops(save=save) as stop:
        with pytest.raises(Interrupted) as info:
            if save:
                deliver(signal.SIGHUP)
            else:
                with stop.step_loop():
                    deliver(signal.SIGHUP)
    assert info.value.exit_code == 129
    why = "" if save else " (trainer.save_on_signal=false)"
    assert str(info.value) == f"stopped on SIGHUP{why}. The last complete checkpoint is /c/global_step_3 (step 3)."


def test_a_safe_point_not_reached_in_time_stops_without_saving():
    with stops(timeout_s=0.2) as stop, stop.step_loop():
        deliver(signal.SIGTERM)
        with pytest.raises(Interrupted) as info:
            time.sleep(5)  # a step that does not finish in time
    assert info.value.exit_code == 143
    assert str(info.value).startswith("stopped on SIGTERM: no safe point was reached within "
                                      "trainer.save_on_signal_timeout_s=0.2s, so no checkpoint was saved.")


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_a_command_outside_a_step_loop_stops_at_once_with_its_consequence(signum):
    """Every command (main_generation, main_eval, main_ppo before its loop): the signal becomes Interrupted, so the
    `finally` clean-ups run and the error path prints it, instead of a silent death (SIGTERM, SIGHUP)."""
    before = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    with pytest.raises(Interrupted) as info, stop_at_once("; nothing was written"):
        deliver(signum)
    assert info.value.exit_code == 128 + signum
    assert str(info.value) == f"stopped on {signal.Signals(signum).name}; nothing was written"
    assert {s: signal.getsignal(s) for s in STOP_SIGNALS} == before
