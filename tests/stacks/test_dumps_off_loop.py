"""Nothing of stacks waits on the supervisor's loop: dumps taken from its timers
(RankDumps.take_async), a rank that does not answer is unknown to the hang rule (not still), a
large reply leaves the stacks socket whole (memoryview, a deadline that grows with its size)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from numarun.process.loop import Loop
from numarun.stacks import channel
from numarun.stacks.dumps import PENDING, RankDumps, _signal_state
from numarun.stacks.hang import HangWatch
from numarun.worker.dumphandler import STACKS_FILE_ENV

# A rank: faulthandler on signal 42 into its file, then parked; with "block", signal 42 stays
# blocked from then on (its dumps never come: as a rank starved of CPU, or in D state).
RANK = textwrap.dedent(
    """
    import faulthandler, os, signal, sys, time
    dump = open(os.environ["NUMARUN_STACKS_FILE"], "a")  # O_APPEND, as the bootstrap opens it
    faulthandler.register(42, file=dump, all_threads=True, chain=False)
    if sys.argv[1] == "block":
        signal.pthread_sigmask(signal.SIG_BLOCK, [42])

    def parked_here():
        print("armed", flush=True)
        while True:
            time.sleep(60)

    parked_here()
    """
)


class LoopSupervisor:
    """A supervisor's loop (a real :class:`Loop`) and what RankDumps and HangWatch need of the
    supervisor, over real child processes."""

    def __init__(self, procs: list[subprocess.Popen[str]]) -> None:
        self.loop = Loop(lambda signum: None)
        self.loop.open()
        self.procs = procs
        self.stopped: str | None = None
        self.longest = 0.0

    def pids(self) -> list[int]:
        return [proc.pid for proc in self.procs]

    def send_signal(self, signum: int, local_ranks: list[int] | None = None) -> list[int]:
        reached = []
        for local_rank in local_ranks if local_ranks is not None else range(len(self.procs)):
            os.kill(self.procs[local_rank].pid, signum)
            reached.append(local_rank)
        return reached

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        def timed() -> None:
            started = time.monotonic()
            callback()
            self.longest = max(self.longest, time.monotonic() - started)

        return self.loop.call_later(delay, timed)

    def call_every(self, interval: float, callback: Callable[[], None]) -> None:
        self.loop.call_every(interval, callback)

    def request_stop(self, reason: str) -> None:
        self.stopped = self.stopped or reason

    def run_until(self, done: Callable[[], bool], limit: float) -> bool:
        deadline = time.monotonic() + limit
        while not done() and time.monotonic() < deadline:
            due = self.loop.next_due()
            self.loop.poll(0.05 if due is None else max(0.0, min(0.05, due - time.monotonic())))
            self.loop.run_due(lambda: True)
        return done()


@pytest.fixture
def ranks(tmp_path: Path) -> Iterator[Callable[..., tuple[RankDumps, LoopSupervisor]]]:
    started: list[subprocess.Popen[str]] = []
    dumps_made: list[RankDumps] = []

    def make(*modes: str) -> tuple[RankDumps, LoopSupervisor]:
        directory = tmp_path / f"d{len(dumps_made)}"
        directory.mkdir(mode=0o700)
        dumps = RankDumps([(r, r) for r in range(len(modes))], str(directory))
        dumps_made.append(dumps)
        procs = []
        script = tmp_path / "rank.py"
        if not script.exists():  # written once: a starting rank may be reading it
            script.write_text(RANK)
        for local_rank, mode in enumerate(modes):
            proc = subprocess.Popen(
                [sys.executable, str(script), mode], stdout=subprocess.PIPE, text=True,
                env={**os.environ, STACKS_FILE_ENV: dumps.path(local_rank)},
            )  # fmt: skip
            started.append(proc)
            procs.append(proc)
        for proc in procs:
            assert proc.stdout is not None and proc.stdout.readline() == "armed\n"
        supervisor = LoopSupervisor(procs)
        dumps.attach(supervisor)  # type: ignore[arg-type]
        return dumps, supervisor

    yield make
    for proc in started:
        proc.kill()
        proc.wait()
    for dumps in dumps_made:
        dumps.close()


def test_dumps_are_taken_from_the_loops_timers_never_waiting_on_it(
    ranks: Callable[..., tuple[RankDumps, LoopSupervisor]],
) -> None:
    dumps, supervisor = ranks("park", "park", "park")
    got: list = []
    started = time.monotonic()
    dumps.take_async(got.append)
    returned = time.monotonic() - started
    assert got == []  # nothing had answered yet: take_async returned at once
    assert returned < 0.5, returned  # only the asking (a signal each), not the answers
    assert supervisor.run_until(lambda: bool(got), 30.0)
    taken = got[0]
    assert [item.rank for item in taken] == [0, 1, 2]
    assert all("in parked_here" in item.text and item.problem is None for item in taken), [
        (item.problem, item.text[-80:]) for item in taken
    ]
    # Each look at the files is a short callback: the loop is free between them.
    assert supervisor.longest < 0.5, supervisor.longest


def test_a_dump_takers_own_failure_is_one_line_never_the_loops(
    ranks: Callable[..., tuple[RankDumps, LoopSupervisor]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # What acts on the dumps (a hang verdict's, a whole-job answer's) runs from the loop's
    # timers: a bug in it used to leave through the supervisor's loop, ending the run.
    dumps, supervisor = ranks("park")
    called: list[int] = []

    def broken(taken: list) -> None:
        called.append(len(taken))
        raise KeyError("a bug")

    dumps.take_async(broken)
    assert supervisor.run_until(lambda: bool(called), 30.0)  # the loop went on past it
    err = capsys.readouterr().err
    assert called == [1]
    assert "numarun: warning: acting on the ranks' dumps failed (KeyError: 'a bug')" in err, err
    assert err.count("\n") == 1 and "the training goes on" in err


def ticked_past_timeout(
    dumps: RankDumps, supervisor: LoopSupervisor, job: MarkingJob | None = None
) -> HangWatch:
    """A hang watch of 0.6 s over ``dumps``, ticked by hand 8 times 0.15 s apart (well past
    its timeout)."""
    hang = HangWatch(dumps, 0.6, output_watched=False, job=job)
    hang.attach(supervisor)  # type: ignore[arg-type]
    for _ in range(8):
        hang.tick()
        time.sleep(0.15)
    return hang


class MarkingJob:
    """The whole job's side of a node's hang watch, noting what the watch told it."""

    def __init__(self, marks: list[str]) -> None:
        self.marks = marks

    def still(self, dumps_: list, idle: float) -> None:
        self.marks.append("still")

    def moving(self) -> None:
        self.marks.append("moving")


def test_a_rank_that_does_not_answer_is_unknown_and_its_node_never_still(
    ranks: Callable[..., tuple[RankDumps, LoopSupervisor]],
) -> None:
    # Issue 24 item 6: a rank whose dump did not come by the next sample counted as "not
    # moving", so a starved rank on a loaded machine could turn a busy job into a hang.
    dumps, supervisor = ranks("park", "block")
    marks: list[str] = []
    hang = ticked_past_timeout(dumps, supervisor, MarkingJob(marks))
    assert _signal_state(supervisor.procs[1].pid) == (True, True)  # caught, still pending
    assert marks == [] and hang.report is None
    assert [item.problem for item in hang.last_raw()][1] == PENDING


def test_a_rank_with_no_python_frame_is_unknown_not_still(
    ranks: Callable[..., tuple[RankDumps, LoopSupervisor]],
) -> None:
    # A rank whose interpreter is exiting (gloo's teardown on a loaded machine: seconds) shows
    # no Python frame in any thread, sample after sample: it was taken for a still rank, and a
    # job whose other node had finished was declared hung.
    dumps, supervisor = ranks("park")
    exiting = b"Current thread 0x00007f3f01481b80 (most recent call first):\n  <no Python frame>\n"
    dumps.read = lambda local_rank: exiting  # type: ignore[method-assign]
    marks: list[str] = []
    hang = ticked_past_timeout(dumps, supervisor, MarkingJob(marks))
    assert marks == [] and hang.report is None


def test_a_hang_watch_whose_own_code_fails_is_one_line_and_the_run_goes_on(
    ranks: Callable[..., tuple[RankDumps, LoopSupervisor]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A diagnostic never ends training: a bug in the watch (here the dump reader raising a
    # KeyError) used to leave tick() through the supervisor's loop, ending the run.
    dumps, supervisor = ranks("park")

    def broken(local_rank: int) -> bytes:
        raise KeyError("a bug")

    dumps.read = broken  # type: ignore[method-assign]
    hang = ticked_past_timeout(dumps, supervisor)
    err = capsys.readouterr().err
    assert err.count("numarun: warning: the hang watch failed (KeyError") == 1, err
    assert "the training goes on" in err
    assert hang.report is None and supervisor.stopped is None


def test_a_node_whose_ranks_all_answer_and_stay_put_is_hung(
    ranks: Callable[..., tuple[RankDumps, LoopSupervisor]],
) -> None:
    dumps, supervisor = ranks("park", "park")
    hang = HangWatch(dumps, 0.6, output_watched=False)
    hang.attach(supervisor)  # type: ignore[arg-type]
    deadline = time.monotonic() + 60
    while hang.report is None and time.monotonic() < deadline:
        hang.tick()
        time.sleep(0.15)
    assert hang.report is not None and supervisor.stopped is not None
    assert supervisor.stopped.startswith("hang: no rank made progress")


def test_a_40_mb_reply_leaves_the_stacks_socket_whole(tmp_path: Path) -> None:
    # Issue 23: the socket copied the rest of its outbox at every send (40 MB: 3.4 s) and cut
    # the reply at its 1 s deadline.
    directory = tmp_path / "rt"
    directory.mkdir(mode=0o700)
    big = {"op": "stacks", "blob": "x" * (40 << 20)}
    loop_sup = LoopSupervisor([])

    class Sup:
        def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
            loop_sup.loop.add_reader(fd, callback)

        def remove_reader(self, fd: int) -> None:
            loop_sup.loop.remove_reader(fd)

        def add_writer(self, fd: int, callback: Callable[[], None]) -> None:
            loop_sup.loop.add_writer(fd, callback)

        def remove_writer(self, fd: int) -> None:
            loop_sup.loop.remove_writer(fd)

    server = channel.JobServer(str(directory), "big", lambda op, request, reply: reply(big))
    server.attach(Sup())  # type: ignore[arg-type]
    received: list[bytes] = []

    def client() -> None:
        with socket.socket(socket.AF_UNIX) as conn:
            conn.settimeout(60)
            conn.connect(server.path)
            conn.sendall(b'{"op": "stacks"}\n')
            chunks = []
            while True:
                chunk = conn.recv(1 << 16)  # a slow reader: small reads
                if not chunk:
                    break
                chunks.append(chunk)
            received.append(b"".join(chunks))

    reader = threading.Thread(target=client)
    reader.start()
    try:
        loop_sup.run_until(lambda: bool(received), 120.0)
    finally:
        reader.join(30)
        server.close()
    assert received and len(received[0]) > 40 << 20
    assert received[0].endswith(b'"}\n')


def test_the_reply_deadline_grows_with_the_reply() -> None:
    assert channel.REPLY_DEADLINE + (40 << 20) / channel.REPLY_RATE > 10
