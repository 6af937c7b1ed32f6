"""numarun.process.standby: a supervisor started ahead of its run (the standbys of ``--preload``):
it runs what it started ahead with the ranks handed over, and a standby that ends before its run
is seen without running the loop; a late sink holds what comes before its sink. The launch
side (warm workers) is ``tests/launch/test_warm.py``'s."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

import pytest

from numarun.process.standby import LateSink

LIMIT = 120.0  # generous: a shared machine at load 30 starts interpreters slowly


def _wait_for(condition: Callable[[], bool], what: str, limit: float = LIMIT) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


# --- the process wing: a supervisor started ahead of its run ------------------------------------


WAITER = (
    "import os, sys\n"
    "print('born', flush=True)\n"
    "if sys.argv[2] != 'now':\n"
    "    os.read(int(sys.argv[1]), 1)  # until its run is handed over\n"
    "sys.exit(int(sys.argv[3]))\n"
)


def test_a_standby_supervisor_runs_what_it_started_ahead_with_the_ranks_handed_over() -> None:
    from numarun.process.spec import WorkerExit, WorkerSpec
    from numarun.process.standby import StandbySupervisor, signals_blocked

    class Sink:
        def __init__(self) -> None:
            self.data = b""

        def feed(self, data: bytes) -> None:
            self.data += data

        def close(self) -> None:
            pass

    # Rank 0 is released when the run starts, rank 1 once rank 0 ended: rank 1's failure
    # (exit 3) must not stop rank 0 before it exits 0 on its own.
    releases = [os.pipe(), os.pipe()]
    lates = [LateSink(), LateSink()]
    specs = [
        WorkerSpec(local_rank=rank, rank=-1, env=dict(os.environ), stdout=lates[rank],
                   argv=[sys.executable, "-c", WAITER, str(releases[rank][0]), "wait",
                         str(3 * rank)],
                   pass_fds=(releases[rank][0],))
        for rank in (0, 1)
    ]  # fmt: skip
    supervisor = StandbySupervisor(specs, grace_period=5.0)
    with signals_blocked((signal.SIGTERM, signal.SIGINT)):
        supervisor.start()
    for read_end, _ in releases:
        os.close(read_end)
    try:
        assert not supervisor.pending_exits()
        sinks = [Sink(), Sink()]
        for late, sink in zip(lates, sinks, strict=True):
            late.attach(sink)
        ended: list[tuple[int, int]] = []

        def on_exit(worker_exit: WorkerExit) -> None:
            ended.append((worker_exit.rank, worker_exit.exit_code or 0))
            if worker_exit.rank == 10:
                os.write(releases[1][1], b"g")

        supervisor.hand_over({0: 10, 1: 11}, on_exit=on_exit)
        result = supervisor.run(on_started=lambda: os.write(releases[0][1], b"g"))
    finally:
        for _, write_end in releases:
            os.close(write_end)
        supervisor.stop(0.0)
    assert [(w.rank, w.exit_code) for w in result.workers] == [(10, 0), (11, 3)]
    assert result.first_failure is not None and result.first_failure.rank == 11
    assert sorted(ended) == [(10, 0), (11, 3)]
    assert [sink.data for sink in sinks] == [b"born\n", b"born\n"]
    with pytest.raises(RuntimeError):
        supervisor.run()


def test_a_standby_that_ends_before_its_run_is_seen_without_running_the_loop() -> None:
    from numarun.process.spec import WorkerSpec
    from numarun.process.standby import StandbySupervisor, signals_blocked

    spec = WorkerSpec(local_rank=0, rank=0, env=dict(os.environ),
                      argv=[sys.executable, "-c", WAITER, "0", "now", "0"])  # fmt: skip
    supervisor = StandbySupervisor([spec])
    with signals_blocked((signal.SIGTERM,)):
        supervisor.start()
    try:
        _wait_for(supervisor.pending_exits, "the standby's end")
    finally:
        result = supervisor.stop(0.0)
    assert [w.exit_code for w in result.workers] == [0]


def test_a_late_sink_holds_what_comes_before_its_sink_then_passes_everything_on() -> None:
    class Sink:
        def __init__(self) -> None:
            self.data, self.closed = b"", 0

        def feed(self, data: bytes) -> None:
            self.data += data

        def close(self) -> None:
            self.closed += 1

    late = LateSink(console="the console", max_held=8)
    late.feed(b"12345")
    late.feed(b"6789abc")  # 4 bytes past the bound
    sink = Sink()
    late.attach(sink)
    late.feed(b"after")
    assert sink.data == (
        b"12345678\n[numarun: 4 bytes the process wrote before its attempt began were dropped]\n"
        b"after"
    )
    assert (late.console, sink.closed) == ("the console", 0)
    late.close()
    assert sink.closed == 1
    with pytest.raises(RuntimeError):
        late.attach(Sink())
    ended = LateSink()
    ended.feed(b"x")
    ended.close()  # the stream ended before the attempt began
    sink = Sink()
    ended.attach(sink)
    assert (sink.data, sink.closed) == (b"x", 1)
