"""numarun.launch.outcome: the launcher's exit status from a run's result (the failed worker's,
128+N for a signal, 124 for a hang unless a signal came first)."""

from __future__ import annotations

import signal
from types import SimpleNamespace

import pytest

from numarun.launch.outcome import exit_code_for

# --- exit codes -----------------------------------------------------------------------------------


def _result(
    exit_code: int | None = None, received: int | None = None, stop_reason: str | None = None
) -> SimpleNamespace:
    failure = None if exit_code is None else SimpleNamespace(exit_code=exit_code)
    return SimpleNamespace(
        workers=[], first_failure=failure, received_signal=received, stop_reason=stop_reason
    )


@pytest.mark.parametrize(
    ("exit_code", "received", "expected"),
    [
        (None, None, 0),
        (3, None, 3),
        (-9, None, 137),
        (-11, None, 139),
        (None, signal.SIGINT, 130),
        (-15, signal.SIGTERM, 143),
        (1, signal.SIGHUP, 129),
    ],
)
def test_exit_code_for(exit_code: int | None, received: int | None, expected: int) -> None:
    assert exit_code_for(_result(exit_code, received)) == expected


def test_a_run_stopped_through_request_stop_is_a_failure() -> None:
    # A hang (--hang-timeout) or the rendezvous ends a run through Supervisor.request_stop:
    # no worker failed, but the run did not succeed.
    assert exit_code_for(_result(None, None, stop_reason="rendezvous closed")) == 1
    assert exit_code_for(_result(3, None, stop_reason="rendezvous closed")) == 3
    assert exit_code_for(_result(None, signal.SIGINT, stop_reason="x")) == 130
    # A hang is 124 (as timeout(1)), even when a rank then exits non-zero in the teardown.
    assert exit_code_for(_result(None, None, stop_reason="hang: rank 1")) == 124
    assert exit_code_for(_result(3, None, stop_reason="hang: rank 1")) == 124


# --- --hang-timeout and the exit status ----------------------------------------------------------


def test_a_hang_exits_124_unless_a_signal_came_first() -> None:
    from numarun.launch.outcome import exit_code_for
    from numarun.process.spec import RunResult, WorkerExit

    ended = WorkerExit(0, 0, 1, -15, "SIGTERM", "terminated", 1.0)
    failed = WorkerExit(1, 1, 2, 1, None, "failed", 1.0)
    assert exit_code_for(RunResult([ended], None, None, [], "hang: no rank moved")) == 124
    assert exit_code_for(RunResult([ended, failed], failed, None, [], "hang: x")) == 124
    assert exit_code_for(RunResult([ended], None, signal.SIGINT, [], "hang: x")) == 130
