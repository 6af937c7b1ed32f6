"""The rank's helper thread (numarun.worker.dumphandler) and the launcher's side of it
(numarun.stacks.rankhelper): the helper takes the stacks holding the GIL, so no thread of the
program has a system call interrupted and none runs Python while its frames are read; a rank
whose GIL is kept in C code is dumped through the signal to its main thread; the helper answers
flight-recorder requests without importing anything; its answers are read as untrusted."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from numarun.launch.workersetup import SCRIPT_BOOTSTRAP
from numarun.process.teardown import send_to_thread
from numarun.stacks.dumps import _signal_state, _structurally_complete, normalized
from numarun.stacks.parse import rank_stacks
from numarun.stacks.rankhelper import RankHelpers, thread_state
from numarun.worker.dumphandler import (
    ANSWER_SUFFIX,
    SIGNAL_SUFFIX,
    STACKS_FILE_ENV,
    STACKS_SIGNAL,
)

# A rank whose main thread sits in poll(2) called through ctypes (the GIL released, and EINTR
# seen as it is: Python's own calls retry), counting the polls a signal interrupted, until the
# file named by its argument appears.
POLLER = textwrap.dedent(
    """
    import ctypes, errno, os, sys, threading
    libc = ctypes.CDLL(None, use_errno=True)
    stop = sys.argv[1]
    interrupted = 0

    def poll_here():
        global interrupted
        print("armed", os.getpid(), [t.name for t in threading.enumerate()],
              repr(os.environ.get("NUMARUN_STACKS_FILE")), flush=True)
        while not os.path.exists(stop):
            if libc.poll(None, 0, 100) == -1 and ctypes.get_errno() == errno.EINTR:
                interrupted += 1

    poll_here()
    print("interrupted", interrupted, "torch" in sys.modules, flush=True)
    """
)


# A rank whose main thread keeps the GIL in C code (sum over a range: no bytecode runs, the GIL
# is never let go) once its argument file appears; recursing in Python until then.
HOLDER = textwrap.dedent(
    """
    import os, sys
    sys.setrecursionlimit(10000)

    def recurse(n):
        return 0 if n == 0 else recurse(n - 1) + 1

    def hold_the_gil_in_c():
        return sum(range(10**12))

    print("armed", flush=True)
    while not os.path.exists(sys.argv[1]):
        recurse(500)
    hold_the_gil_in_c()
    """
)


class Rank:
    """One rank started through numarun's bootstrap with its dump file and helper files."""

    def __init__(self, tmp_path: Path, program: str = POLLER) -> None:
        self.dump = tmp_path / "rank0"
        self.dump.write_bytes(b"")
        self.signalled = tmp_path / f"rank0{SIGNAL_SUFFIX}"
        self.helpers = RankHelpers(str(tmp_path), [0])
        self.stop = tmp_path / "stop"
        script = tmp_path / "program.py"
        script.write_text(program)
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", SCRIPT_BOOTSTRAP, str(script), str(self.stop)],
            env={**os.environ, STACKS_FILE_ENV: str(self.dump)},
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        self.seen = self.proc.stdout.readline()
        self.tid = self.helpers.thread_id(0)
        self.fd = os.open(self.dump, os.O_RDWR | os.O_CLOEXEC)

    def ask(self, limit: float = 30.0, *, nudge: bool = False) -> bytes:
        """Ask the helper for the stacks (as RankDumps does: the file emptied, a request
        line) and wait for the whole dump; ``nudge``: signal the main thread when the helper
        says so (RankHelpers.should_nudge), as RankDumps.nudge does."""
        os.ftruncate(self.fd, 0)
        self.helpers.request([0], stacks=True, flight=False)
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline:
            data = self.helpers.stacks_dump(0, self.fd)
            if _structurally_complete(data) or data.endswith(b"  ...\n"):
                return data
            if nudge and self.helpers.should_nudge(0, self.proc.pid):
                assert send_to_thread(self.proc.pid, self.proc.pid, STACKS_SIGNAL)
            time.sleep(0.005)
        raise AssertionError(f"no complete dump: {self.dump.read_bytes()!r}")

    def finish(self) -> tuple[int, bool]:
        """(polls interrupted, whether torch was imported) as the rank counted them."""
        self.stop.write_text("")
        assert self.proc.stdout is not None
        words = self.proc.stdout.readline().split()
        self.proc.wait(30)
        return int(words[1]), words[2] == "True"

    def close(self) -> None:
        self.stop.write_text("")
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        os.close(self.fd)
        self.helpers.close()


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[Rank]:
    started = Rank(tmp_path)
    try:
        yield started
    finally:
        started.close()


def test_the_helper_says_its_thread_and_stays_out_of_the_programs_sight(rank: Rank) -> None:
    words = rank.seen.split(maxsplit=2)
    assert words[0] == "armed" and "['MainThread']" in words[2]  # not a threading.Thread
    assert words[2].endswith("None\n")  # the variable is gone
    assert rank.tid is not None and rank.tid != rank.proc.pid
    # Reading its FIFO: asleep once it got there (at load the thread may still be on its way
    # when the program says "armed", so a single look can see it running).
    deadline = time.monotonic() + 30.0
    while thread_state(rank.proc.pid, rank.tid) != "S" and time.monotonic() < deadline:
        time.sleep(0.01)
    assert thread_state(rank.proc.pid, rank.tid) == "S"
    caught, pending = _signal_state(rank.proc.pid) or (False, True)
    assert caught and not pending  # the handler, for when the GIL cannot be had


def test_the_helpers_dumps_interrupt_no_call_of_the_program(rank: Rank) -> None:
    for _ in range(5):
        data = rank.ask()
        assert data.startswith((b"Thread 0x", b"Current thread 0x")) and b"in poll_here" in data
        time.sleep(0.05)
    interrupted, torch_loaded = rank.finish()
    assert interrupted == 0
    assert not torch_loaded


def test_a_signal_to_the_process_does_interrupt_the_program(rank: Rank) -> None:
    """What the helper avoids (and what makes the test above able to fail): the kernel gives
    a process's signal to the main thread, whose poll then fails with EINTR."""
    for _ in range(5):
        rank.signalled.write_bytes(b"")
        os.kill(rank.proc.pid, STACKS_SIGNAL)
        deadline = time.monotonic() + 30
        while not _structurally_complete(rank.signalled.read_bytes()):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        time.sleep(0.05)
    interrupted, _ = rank.finish()
    assert interrupted >= 1


def test_the_helpers_thread_is_left_out_of_the_stacks(rank: Rank) -> None:
    data = rank.ask()
    assert b"_numarun_stacks_helper" in data  # faulthandler dumps it (it took the dump)
    stacks = rank_stacks(0, 0, rank.proc.pid, data.decode(), None)
    assert len(stacks.threads) == 1
    functions = [frame.function for frame in stacks.threads[0].frames]
    assert "poll_here" in functions and "_numarun_stacks_helper" not in functions
    assert b"_numarun_stacks_helper" not in normalized(data)


def test_a_rank_keeping_the_gil_in_c_is_dumped_by_the_signal_to_its_main_thread(
    tmp_path: Path,
) -> None:
    holder = Rank(tmp_path, HOLDER)
    try:
        busy = [holder.ask(nudge=True) for _ in range(20)]  # a busy interpreter, many dumps
        assert all(b"program.py" in data for data in busy)  # the main thread, each time
        holder.stop.write_text("")
        deadline = time.monotonic() + 60
        while True:  # until the main thread is inside the sum, keeping the GIL
            data = holder.ask(nudge=True)
            if b"in hold_the_gil_in_c" in data:
                break
            assert time.monotonic() < deadline, data
        assert holder.helpers.nudged(0)  # the helper never got the GIL: the handler's dump
        assert holder.proc.poll() is None  # and the rank lives on
    finally:
        holder.close()


def test_a_flight_request_is_answered_without_importing_torch(rank: Rank) -> None:
    request, asked = rank.helpers.request([0], stacks=False, flight=True)
    assert asked == [0]
    deadline = time.monotonic() + 30
    answer = None
    while answer is None and time.monotonic() < deadline:
        answer = rank.helpers.answer(0, request)
        time.sleep(0.01)
    assert answer == ("none", b"torch.distributed not imported")
    assert rank.helpers.answer(0, request + 1) is None  # not this request's
    _, torch_loaded = rank.finish()
    assert not torch_loaded


EXITING = textwrap.dedent(
    """
    import atexit, os, time
    before = len(os.listdir("/proc/self/task"))
    atexit._run_exitfuncs()  # what the interpreter's exit runs first
    deadline = time.monotonic() + 30
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    print("threads", before, len(os.listdir("/proc/self/task")), flush=True)
    """
)


def test_the_helper_ends_before_the_interpreter_is_torn_down(tmp_path: Path) -> None:
    """A helper thread left at the interpreter's finalization made about one DDP job in ten
    die at its exit ("terminate called without an active exception"): it ends at atexit."""
    rank = Rank(tmp_path, EXITING)
    try:
        assert rank.seen.split() == ["threads", "2", "1"]
    finally:
        rank.close()


@pytest.mark.parametrize(
    "content",
    [b"", b"numarun-fr 1 2 ok", b"numarun-fr 1 2 ok 5\nabc", b"numarun-fr x 2 ok 1\na",
     b"numarun-fr 1 2 owned 1\na", b"other 1 2 ok 1\na", b"numarun-fr 1 2 ok 1 9\na",
     b"numarun-fr 1 2 ok " + b"9" * 40 + b"\n"],
)  # fmt: skip
def test_answers_that_do_not_parse_are_no_answer(tmp_path: Path, content: bytes) -> None:
    helpers = RankHelpers(str(tmp_path), [0])
    try:
        (tmp_path / f"rank0{ANSWER_SUFFIX}").write_bytes(content)
        assert helpers.answer(0, 1) is None
        assert helpers.thread_id(0) in (None, 2)
    finally:
        helpers.close()


def test_an_answer_larger_than_numarun_reads_is_an_error(tmp_path: Path) -> None:
    helpers = RankHelpers(str(tmp_path), [0])
    try:
        (tmp_path / f"rank0{ANSWER_SUFFIX}").write_bytes(b"numarun-fr 1 2 ok 999999999999\n")
        assert helpers.answer(0, 1) == ("error", b"the answer is larger than numarun reads")
    finally:
        helpers.close()
