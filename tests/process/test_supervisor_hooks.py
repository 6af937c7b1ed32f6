"""The supervisor's extension points: timers, readers, on_failure, send_signal, request_stop."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

import pytest

from numarun.errors import UsageError
from numarun.process.spec import RunResult, WorkerExit, WorkerSpec
from numarun.process.supervisor import Supervisor

PY = sys.executable
ENV = {key: value for key, value in os.environ.items() if key != "NUMARUN_RUN_ID"}
SLEEP = "import time; time.sleep(60)"


def spec(rank: int, code: str) -> WorkerSpec:
    return WorkerSpec(local_rank=rank, rank=rank, env=ENV, argv=[PY, "-c", code])


def running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


def test_timer_runs_while_workers_run_and_can_stop_the_run() -> None:
    calls: list[float] = []
    sup = Supervisor([spec(0, SLEEP), spec(1, SLEEP)], grace_period=5)

    def tick() -> None:
        calls.append(time.monotonic())
        if len(calls) == 3:
            sup.request_stop("three ticks")

    sup.call_every(0.05, tick)
    result = sup.run()
    assert len(calls) == 3  # no tick after the stop began
    assert calls == sorted(calls)
    assert result.stop_reason == "three ticks"
    assert result.first_failure is None and result.received_signal is None
    assert [w.state for w in result.workers] == ["terminated", "terminated"]
    assert [w.exit_code for w in result.workers] == [-signal.SIGTERM] * 2


def test_no_stop_reason_when_the_run_ends_on_its_own() -> None:
    sup = Supervisor([spec(0, "pass")])
    sup.call_every(30, lambda: None)
    result = sup.run()
    assert result.stop_reason is None
    assert result.workers[0].state == "succeeded"


def test_request_stop_after_a_failure_keeps_the_failure_as_the_cause() -> None:
    sup = Supervisor([spec(0, "raise SystemExit(3)"), spec(1, SLEEP)], grace_period=5)
    result = sup.run()
    sup.request_stop("too late")  # the run is over: nothing happens
    assert result.first_failure is not None and result.first_failure.exit_code == 3
    assert result.stop_reason is None


def test_reader_callback_runs_in_the_loop_and_can_signal_workers(tmp_path: Path) -> None:
    ours, theirs = socket.socketpair()
    seen: list[bytes] = []
    ready = tmp_path / "ready"
    code = (
        "import signal, sys, time\n"
        "signal.signal(signal.SIGUSR1, lambda *a: sys.exit(7))\n"
        f"open({str(ready)!r}, 'w').close()\n"
        "time.sleep(60)\n"
    )
    sup = Supervisor([spec(0, code), spec(1, SLEEP)], grace_period=5)

    def readable() -> None:
        seen.append(ours.recv(100))
        assert sup.send_signal(signal.SIGUSR1, local_ranks=[0]) == [0]

    sup.add_reader(ours.fileno(), readable)
    try:
        sup.start()
        # Rank 0's handler is in place (an interpreter's start-up, seconds under load): a
        # fixed sleep let SIGUSR1 kill it with its default action instead.
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline, "rank 0 never installed its handler"
            time.sleep(0.01)
        theirs.send(b"go")
        result = sup.wait()
    finally:
        ours.close()
        theirs.close()
    assert seen == [b"go"]
    assert result is not None and result.first_failure is not None
    assert result.first_failure.local_rank == 0 and result.first_failure.exit_code == 7


def test_on_failure_runs_once_before_the_others_are_signalled() -> None:
    seen: list[tuple[int, list[bool]]] = []
    sup: Supervisor

    def on_failure(ended: WorkerExit) -> None:
        # The other worker must still be running: nothing has been signalled yet.
        seen.append((ended.local_rank, [running(pid) for pid in sup.pids()]))

    sup = Supervisor(
        [spec(0, SLEEP), spec(1, "import time; time.sleep(0.2); raise SystemExit(5)")],
        grace_period=5,
        on_failure=on_failure,
    )
    result = sup.run()
    assert seen == [(1, [True, False])]
    assert result.first_failure is not None and result.first_failure.local_rank == 1
    assert result.workers[0].state == "terminated"


def test_send_signal_skips_exited_workers() -> None:
    sent: list[tuple[int, int]] = []

    def kill(pid: int, signum: int) -> None:
        sent.append((pid, signum))
        os.kill(pid, signum)

    sup = Supervisor([spec(0, "pass"), spec(1, SLEEP)], grace_period=5, kill=kill)
    reached: list[list[int]] = []

    def tick() -> None:
        if sup._workers[0].exited:
            reached.append(sup.send_signal(signal.SIGTERM))

    sup.call_every(0.05, tick)
    result: RunResult = sup.run()
    assert reached and reached[0] == [1]
    pid0 = result.workers[0].pid
    assert all(pid != pid0 and pid != -pid0 for pid, _ in sent)


def test_bad_timer_and_duplicate_reader_are_refused() -> None:
    sup = Supervisor([spec(0, "pass")])
    with pytest.raises(UsageError, match="interval > 0"):
        sup.call_every(0, lambda: None)
    ours, theirs = socket.socketpair()
    try:
        sup.add_reader(ours.fileno(), lambda: None)
        with pytest.raises(UsageError, match="already has a reader"):
            sup.add_reader(ours.fileno(), lambda: None)
        sup.remove_reader(ours.fileno())
        sup.remove_reader(ours.fileno())  # twice: nothing happens
    finally:
        ours.close()
        theirs.close()


def test_a_raising_callback_tears_everything_down_and_propagates() -> None:
    sup = Supervisor([spec(0, SLEEP)], grace_period=5)

    def boom() -> None:
        raise RuntimeError("callback failed")

    sup.call_every(0.05, boom)
    sup.start()
    pid = sup.pids()[0]
    with pytest.raises(RuntimeError, match="callback failed"):
        sup.wait()
    assert not running(pid)


def test_a_signal_during_a_teardown_request_stop_began_is_the_runs_signal_too() -> None:
    """Another node's notice stops this node's workers (request_stop); the user's SIGTERM
    comes while they end. It was taken for a second request only (the rest of the grace
    period skipped) and not reported: the launcher took the stop for the notice's alone,
    re-joined the rendezvous, and waited there for nodes that were all ending (seen at load
    in tests/e2e/test_jobwide_jobs.py, the node never ending)."""
    holds_on = "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None); time.sleep(60)"
    sup = Supervisor([spec(0, holds_on)], grace_period=30)

    def notice() -> None:
        sup.request_stop("node 3 stopped")
        os.kill(os.getpid(), signal.SIGTERM)  # read by the loop once the teardown began

    sup.call_later(0.5, notice)
    result = sup.run()
    assert result.received_signal == signal.SIGTERM
    assert result.stop_reason == "node 3 stopped"
    # Asked twice: no grace left (SIGTERM itself, where it came before the worker's handler).
    assert result.workers[0].exit_code in (-signal.SIGKILL, -signal.SIGTERM)
