"""The launcher's side of stack dumps: take every rank's Python stacks on demand, at a failure and
on a hang, through one :class:`numarun.process.supervisor.Supervisor` and without threads
(:class:`RankDumps`).

Mechanism. Each rank's bootstrap (:mod:`numarun.worker.dumphandler`) starts a helper thread and
registers :mod:`faulthandler` on signal 42 (:data:`STACKS_SIGNAL`); its files are one set per
rank in a private directory of the launcher's (``<runtime dir>/<job>.d/rank<local rank>`` and
the helper's ``.req``, ``.fr``, ``.sig``; 0700, in the per-user directory of
:func:`runtime_dir`, which :mod:`numarun.stacks.channel`'s job sockets share; it is here, not
there, so that setting up a job's dumps before its workers start does not load the channel).
To take stacks, the launcher empties a rank's file and writes a request line to its helper
(:mod:`numarun.stacks.rankhelper`), which dumps every thread while it holds the GIL: nothing of
the program is interrupted, and nothing goes to its stdout/stderr.
A rank whose helper has not answered after :data:`~numarun.stacks.rankhelper.NUDGE_AFTER`
seconds while it sleeps waiting for the GIL is *nudged* (:meth:`RankDumps.nudge`): signal 42 to
its main thread alone, whose faulthandler handler dumps from C, GIL held or not. A rank without
a helper (it could not start it) gets signal 42 as a process through
:meth:`Supervisor.send_signal`, as before the helper existed. Only rank processes are asked or
signalled, never their children (a DataLoader worker forked from a rank inherits the
registration, not the helper). With ``flight``, the same request asks the helper for the rank's
flight recorder (:attr:`Raw.flight`).

Safety. Signal 42 kills by default, so it is sent only to a rank whose ``/proc/<pid>/status``
shows it caught (``SigCgt``) -- not yet armed (interpreter start-up) or running another program
after ``exec`` means no signal -- and not while a previous one is still pending (``ShdPnd``,
and the thread's ``SigPnd``). The remaining window is the few microseconds between that read
and the signal, in which a rank would have to ``exec``. A rank whose own code took the signal
over (its handler replaced numarun's: the user's handler wins) is reported as such and not
signalled again in this run; with a helper, it is still asked through it.

When a dump is complete. faulthandler writes no end marker. A dump is taken as complete when
its last line is the bottom of the main thread (listed last, so written last), which for both
bootstraps is their ``-c`` code (``File "<string>", line 1 in <module>``), or faulthandler's
``...`` after 100 threads; any other dump that ends with a newline and has not
grown for 25 ms is taken too (a fork worker's, a stack deeper than 100 frames).
:meth:`RankDumps.take_async` never waits: it asks, then looks at the files from the supervisor's
timers (:meth:`Supervisor.call_later`: after 1 ms, then twice as long each time, at most 25 ms
apart) and hands the dumps, unparsed (:class:`Raw`), to its callback once each is complete or
``limit`` seconds (1 s) passed; the loop is free in between. :meth:`RankDumps.take` is the same
in a blocking form, for the supervisor's ``on_failure`` (whose contract is to finish before the
teardown signals anyone): it waits at most ``limit`` seconds for all ranks together, typically a
few milliseconds.

The hang verdict built on these dumps is :mod:`numarun.stacks.hang`; a job's stacks wired into
one supervisor (the socket, at a failure) are :mod:`numarun.stacks.jobstacks`.

Cost: per tick and rank, one read of ``/proc/<pid>/status``, one request line (or one signal),
one read and one truncation of a small file in the launcher, and one faulthandler dump (tens of
microseconds) in the rank, taken holding the GIL; ``benchmarks/bench_stacks.py`` measures the
launcher's CPU.
"""

from __future__ import annotations

import os
import stat
import sys
import time

from numarun.errors import UsageError, suppress
from numarun.process import forkexec
from numarun.stacks.rankhelper import FlightAnswer, RankHelpers, read_proc, reason_text
from numarun.worker.dumphandler import HELPER_FUNCTION, STACKS_FILE_ENV, STACKS_SIGNAL

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence

    from numarun.process.spec import WorkerExit
    from numarun.process.supervisor import Supervisor
    from numarun.stacks.parse import RankStacks

RUNTIME_DIR_ENV = "NUMARUN_RUNTIME_DIR"  # one directory instead of the default places
HANG_REASON = "hang: "  # RunResult.stop_reason of a run ended by HangWatch starts with this
HANG_EXIT_CODE = 124  # as timeout(1): "the command timed out"
TAKE_LIMIT = 1.0  # seconds to wait for every rank's dump together
_MAX_DUMP = 4 * 1024 * 1024  # faulthandler's own limits keep a dump far below this
_POLL = 0.001
_QUIET_ANY = 0.025
_REPLACED_AFTER = 0.1  # signal delivered, file still empty this long: someone else's handler
_SIG_BIT = 1 << (STACKS_SIGNAL - 1)

NO_HELPER = "the rank has no numarun helper thread to answer"
UNANSWERED = (
    "no answer: its helper thread did not get the GIL in time (a rank starved of CPU), and "
    "the signal that followed was not answered either"
)
UNREAD = "its helper has not read numarun's earlier requests (a rank starved of CPU)"
NOT_PYTHON = "not a Python process (--no-python)"
EXITED = "exited"
# The bootstrap arms the dump just before the program's first line, so a rank without it has
# not started the program yet (it is still starting up), or has exec'd another program.
NOT_ARMED = "the rank had not started the program's code yet (or runs another program now)"
PENDING = (
    f"signal {STACKS_SIGNAL} is still pending (the rank blocks it, or is in uninterruptible "
    "sleep)"
)
REPLACED = (
    f"unavailable: the rank's own code handles signal {STACKS_SIGNAL} (its handler replaced "
    "numarun's)"
)


def _signal_state(pid: int, tid: int | None = None) -> tuple[bool, bool] | None:
    """(caught, pending) for :data:`STACKS_SIGNAL` from ``/proc/<pid>/status``, or with
    ``tid`` from that thread's ``/proc/<pid>/task/<tid>/status`` (pending: for the process or
    for the thread); None when the process (or the thread) is gone, or a zombie."""
    path = f"/proc/{pid}/status" if tid is None else f"/proc/{pid}/task/{tid}/status"
    data = read_proc(path, 16384)
    if data is None:
        return None
    caught = pending = False
    for field in (b"\nShdPnd:", b"\nSigPnd:"):
        start = data.find(field)
        if start >= 0:
            pending |= bool(int(data[start + 8 : data.index(b"\n", start + 1)], 16) & _SIG_BIT)
    start = data.find(b"\nSigCgt:")
    if start >= 0:
        caught = bool(int(data[start + 8 : data.index(b"\n", start + 1)], 16) & _SIG_BIT)
    if b"\nState:\tZ" in data or b"\nState:\tX" in data:
        return None
    return caught, pending


def _structurally_complete(data: bytes) -> bool:
    """True when ``data`` ends where a dump through numarun's bootstraps ends: the bottom
    frame of the main thread (listed last) is the bootstrap's ``-c`` code, ``<string>`` line 1
    -- or faulthandler's ``...`` after 100 threads. (A fork worker's bottom frame is its
    parent's, unknown here: its dump is taken once quiet.)"""
    return data.endswith((b'  File "<string>", line 1 in <module>\n', b"\n...\n"))


_HELPER_FRAME = f" in {HELPER_FUNCTION}\n".encode()


def normalized(dump: bytes) -> bytes:
    """A dump without what changes when nothing moved: which thread ran the handler, and
    numarun's helper thread (:mod:`numarun.worker.dumphandler`: reading its requests, or
    answering one)."""
    dump = dump.replace(b"Current thread ", b"Thread ")
    if _HELPER_FRAME not in dump:
        return dump
    return b"\n\n".join(block for block in dump.split(b"\n\n")
                        if not (block.rstrip(b"\n") + b"\n").endswith(_HELPER_FRAME))  # fmt: skip


class Raw:
    """One rank's dump as read, not parsed (parsing waits for a thread other than the loop):
    ``text`` empty when ``problem`` says why there is none."""

    __slots__ = ("flight", "local_rank", "pid", "problem", "rank", "text")

    def __init__(
        self,
        rank: int,
        local_rank: int,
        pid: int | None,
        text: str,
        problem: str | None,
        flight: FlightAnswer | None = None,
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.pid = pid
        self.text = text
        self.problem = problem
        self.flight = flight  # the rank's flight recorder, when it was asked for

    @classmethod
    def of(cls, stacks: RankStacks) -> Raw:
        return cls(stacks.rank, stacks.local_rank, stacks.pid, stacks.text, stacks.problem)


def rank_file(directory: str, local_rank: int) -> str:
    """The dump file of ``local_rank`` in a job's dump directory."""
    return os.path.join(directory, f"rank{local_rank}")


def make_files(directory: str, local_ranks: Iterable[int]) -> list[str]:
    """Make ``directory`` (0700) and an empty dump file (0600) per local rank in it, with its
    helper's files (:func:`numarun.stacks.rankhelper.make_helper_files`), ahead of the
    :class:`RankDumps` that will read them (``made=True``); their paths. On an error nothing
    stays."""
    from numarun.stacks.rankhelper import make_helper_files

    os.mkdir(directory, 0o700)
    paths: list[str] = []
    try:
        for local_rank in local_ranks:
            path = rank_file(directory, local_rank)
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                             | os.O_CLOEXEC, 0o600))  # fmt: skip
            make_helper_files(path)
            paths.append(path)
    except BaseException:
        remove_files(directory)
        raise
    return paths


def remove_files(directory: str) -> None:
    """Remove a dump directory and its files (never following a link); best effort."""
    with suppress(OSError):
        for name in os.listdir(directory):
            with suppress(OSError):
                os.unlink(os.path.join(directory, name))
    with suppress(OSError):
        os.rmdir(directory)


def warn_failed(what: str, error: Exception, consequence: str) -> None:
    """One line on stderr: ``what`` failed with ``error`` (its first line, bounded), the
    ``consequence``, and that the training goes on (diagnostics never end it)."""
    text = str(error).strip().split("\n", 1)[0][:200] or type(error).__name__
    with suppress(OSError, ValueError):
        sys.stderr.write(f"numarun: warning: {what} failed ({type(error).__name__}: {text}); "
                         f"{consequence}, the training goes on\n")  # fmt: skip
        sys.stderr.flush()

class _Collection:
    """One taking of dumps in progress: which ranks are still awaited, what was read, since
    when each file stopped growing."""

    def __init__(
        self,
        dumps: RankDumps,
        wanted: list[int],
        limit: float,
        *,
        stacks: bool = True,
        flight: bool = False,
    ) -> None:
        self.dumps = dumps
        self.wanted = wanted
        self.limit = limit
        self.problems, self.flight_request, self.flight_pending = dumps.ask_for(
            wanted, stacks=stacks, flight=flight
        )
        self.texts: dict[int, bytes] = {}
        self.pending = [r for r in wanted if r not in self.problems] if stacks else []
        self.deadline = time.monotonic() + limit
        self.seen: dict[int, tuple[int, float]] = {}  # local rank -> (size, when it changed)
        self.flight: dict[int, FlightAnswer] = {}
        if flight:
            for local_rank in wanted:
                if local_rank not in self.problems and local_rank not in self.flight_pending:
                    self.flight[local_rank] = dumps.flight_answer(
                        local_rank, "unanswered", reason=NO_HELPER
                    )

    def step(self) -> bool:
        """Read what the awaited ranks wrote; True once every dump (and flight recorder
        asked for) is complete or the time is up (then what is missing is said)."""
        self._step_flight()
        dumps = self.dumps
        now = time.monotonic()
        for local_rank in list(self.pending):
            data = dumps.read(local_rank)
            if not data:
                dumps.nudge(local_rank)  # a helper that cannot get the GIL: signal it
            size, since = self.seen.get(local_rank, (-1, now))
            if len(data) != size:
                self.seen[local_rank] = (len(data), now)
                since = now
            done = _structurally_complete(data) or (
                data.endswith(b"\n") and now - since >= _QUIET_ANY
            )
            problem = None if data else dumps.answer_problem(local_rank, data, final=False)
            if done or problem is not None:
                self.pending.remove(local_rank)
                self.texts[local_rank] = data
                if problem is not None:
                    self.problems[local_rank] = problem
        if not self.pending and not self.flight_pending:
            return True
        if now < self.deadline:
            return False
        for local_rank in self.flight_pending:
            self.flight[local_rank] = dumps.flight_answer(
                local_rank, "unanswered",
                reason=f"no answer within {self.limit:g} s (its main thread may hold the GIL)",
            )  # fmt: skip
        self.flight_pending = []
        for local_rank in self.pending:
            data = dumps.read(local_rank)
            self.texts[local_rank] = data
            self.problems[local_rank] = (
                f"incomplete: the dump was still being written after {self.limit:g} s"
                if data
                else dumps.answer_problem(local_rank, data, final=True)
                or f"no dump within {self.limit:g} s"
            )
        self.pending = []
        return True

    def _step_flight(self) -> None:
        for local_rank in list(self.flight_pending):
            found = self.dumps.helpers_answer(local_rank, self.flight_request)
            if found is not None:
                self.flight_pending.remove(local_rank)
                status, body = found
                self.flight[local_rank] = self.dumps.flight_answer(
                    local_rank, status, body if status == "ok" else b"",
                    "" if status == "ok" else reason_text(body),
                )  # fmt: skip

    def raw(self) -> list[Raw]:
        ranks = self.dumps._ranks
        return [
            Raw(ranks[r].rank, r, ranks[r].pid or None,
                self.texts.get(r, b"").decode("utf-8", "replace"), self.problems.get(r),
                self.flight.get(r))
            for r in self.wanted
        ]  # fmt: skip


class _Rank:
    """One rank's dump file and what the launcher knows of it (a plain class: a dataclass
    would cost the launcher's start-up a millisecond)."""

    __slots__ = ("asked_at", "exited", "fd", "local_rank", "pid", "rank", "replaced")

    def __init__(self, local_rank: int, rank: int, fd: int | None) -> None:
        self.local_rank = local_rank
        self.rank = rank
        self.fd = fd
        self.pid = 0
        self.exited = False
        self.replaced = False
        self.asked_at: float | None = None  # monotonic time of the last signal


class RankDumps:
    """One job's dump files, the reserved signal, and collecting what the ranks wrote.

    ``ranks``: (local rank, global rank) pairs. ``directory`` None: the ranks are not Python
    (``--no-python``) and are never signalled. Files are made here (0600, close-on-exec, kept
    open), or with ``made`` found made already (by :func:`make_files`: the files ``--preload``
    standbys were armed on at birth); :meth:`close` closes and removes them.
    """

    def __init__(
        self, ranks: Sequence[tuple[int, int]], directory: str | None, *, made: bool = False
    ) -> None:
        self.directory = directory
        self._ranks: dict[int, _Rank] = {}
        self._supervisor: Supervisor | None = None
        self.helpers: RankHelpers | None = None
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC
        if not made:
            flags |= os.O_CREAT | os.O_EXCL
        try:
            if directory is not None:
                local_ranks = [local_rank for local_rank, _ in ranks]
                self.helpers = RankHelpers(directory, local_ranks, made=made)
            for local_rank, rank in ranks:
                fd = None
                if directory is not None:
                    fd = os.open(self.path(local_rank), flags, 0o600)
                    forkexec.track(fd)  # forked workers close it
                self._ranks[local_rank] = _Rank(local_rank, rank, fd)
        except BaseException:
            self.close()
            raise

    def path(self, local_rank: int) -> str:
        assert self.directory is not None
        return rank_file(self.directory, local_rank)

    def worker_env(self, local_rank: int) -> dict[str, str]:
        """What the rank's environment needs for its bootstrap to arm the dump."""
        if self.directory is None:
            return {}
        return {STACKS_FILE_ENV: self.path(local_rank)}

    def attach(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def note_exit(self, ended: WorkerExit) -> None:
        """The supervisor's ``on_exit``: an exited rank is never asked again."""
        state = self._ranks.get(ended.local_rank)
        if state is not None:
            state.exited = True
            state.asked_at = None

    @property
    def local_ranks(self) -> list[int]:
        return sorted(self._ranks)

    def live(self) -> list[int]:
        return [r for r in self.local_ranks if not self._ranks[r].exited]

    def _refresh_pids(self) -> None:
        if self._supervisor is None:
            return
        pids = self._supervisor.pids()
        if len(pids) == len(self._ranks):
            for local_rank, pid in zip(self.local_ranks, pids, strict=True):
                self._ranks[local_rank].pid = pid

    # --- asking --------------------------------------------------------------------------------

    def ask(self, local_ranks: Iterable[int] | None = None) -> dict[int, str]:
        """Empty each rank's file and ask it for its stacks (its helper through its FIFO, a
        rank without one by signal 42); returns the problem of each rank that was not asked
        (not Python, exited, not armed, signal pending, handler replaced)."""
        wanted = self.local_ranks if local_ranks is None else list(local_ranks)
        return self.ask_for(wanted, stacks=True, flight=False)[0]

    def ask_for(
        self, local_ranks: Sequence[int], *, stacks: bool, flight: bool
    ) -> tuple[dict[int, str], int, list[int]]:
        """Ask ``local_ranks`` for their stacks and/or flight recorders: (the problem of each
        rank not asked, the flight-recorder request number, the local ranks asked for it:
        those with a helper)."""
        self._refresh_pids()
        problems: dict[int, str] = {}
        ready: list[int] = []
        for local_rank in local_ranks:
            problem = self._check(self._ranks[local_rank])
            if problem is None:
                ready.append(local_rank)
            else:
                problems[local_rank] = problem
        helped = [r for r in ready if self._thread(r) is not None]
        request, sent = 0, []
        if helped and (stacks or flight):
            assert self.helpers is not None
            if stacks:
                for local_rank in helped:
                    os.ftruncate(self._ranks[local_rank].fd, 0)  # type: ignore[arg-type]
            request, sent = self.helpers.request(helped, stacks=stacks, flight=flight)
            for local_rank in helped:
                if local_rank not in sent:
                    problems[local_rank] = UNREAD
        signalled = [r for r in ready if r not in helped] if stacks else []
        if signalled:
            assert self._supervisor is not None
            for local_rank in signalled:
                os.ftruncate(self._ranks[local_rank].fd, 0)  # type: ignore[arg-type]
            reached = set(self._supervisor.send_signal(STACKS_SIGNAL, signalled))
            problems.update({r: EXITED for r in signalled if r not in reached})
        now = time.monotonic()
        for local_rank in (sent if stacks else []) + signalled:
            if local_rank not in problems:
                self._ranks[local_rank].asked_at = now
        return problems, request, (sent if flight else [])

    def problems(self, local_ranks: Iterable[int]) -> dict[int, str]:
        """Why each of ``local_ranks`` could not be asked now (as :meth:`ask` would say),
        without asking anyone."""
        self._refresh_pids()
        found = {}
        for local_rank in local_ranks:
            problem = self._check(self._ranks[local_rank])
            if problem is not None:
                found[local_rank] = problem
        return found

    def helpers_answer(self, local_rank: int, request: int) -> tuple[str, bytes] | None:
        """The rank's complete answer to flight-recorder ``request``, or None (not yet)."""
        if self.helpers is None:
            return None
        return self.helpers.answer(local_rank, request)

    def flight_answer(
        self, local_rank: int, status: str, data: bytes = b"", reason: str = ""
    ) -> FlightAnswer:
        return FlightAnswer(self._ranks[local_rank].rank, local_rank, status, data, reason)

    def nudge(self, local_rank: int) -> bool:
        """Signal the rank's main thread when its helper's stacks request went unanswered
        while the helper sleeps, waiting for the GIL (:mod:`numarun.stacks.rankhelper`): the
        handler then dumps from the thread most likely holding it. True when the signal went;
        only while the handler is installed and no signal is pending."""
        state = self._ranks[local_rank]
        if (self._thread(local_rank) is None or state.exited or state.replaced
                or self._supervisor is None):  # fmt: skip
            return False
        assert self.helpers is not None
        if not self.helpers.should_nudge(local_rank, state.pid):
            return False
        signals = _signal_state(state.pid, state.pid)
        if signals is None or not signals[0] or signals[1]:
            return False  # no handler installed (a default action kills), or one pending
        try:
            main = {local_rank: state.pid}  # the main thread's id is the process's
            return bool(self._supervisor.send_thread_signal(STACKS_SIGNAL, main))
        except OSError:  # no tgkill here: the process (the kernel picks the main thread)
            return bool(self._supervisor.send_signal(STACKS_SIGNAL, [local_rank]))

    def has_helper(self, local_rank: int) -> bool:
        """Whether the rank is asked through its helper thread (then a handler of its own for
        signal 42 costs only the fallback signal)."""
        return self._thread(local_rank) is not None

    def awaiting_signal(self, local_rank: int) -> bool:
        """Whether the rank's helper was signalled for its outstanding stacks request (its
        dump comes from the handler: do not ask again before it is read)."""
        return self.helpers is not None and self.helpers.nudged(local_rank)

    def _thread(self, local_rank: int) -> int | None:
        return self.helpers.thread_id(local_rank) if self.helpers is not None else None

    def _state(self, state: _Rank) -> tuple[bool, bool] | None:
        """:func:`_signal_state` of the rank's helper thread, or of the process when it has
        none (a helper no longer there is forgotten: the process is signalled again)."""
        tid = self._thread(state.local_rank)
        if tid is not None:
            signals = _signal_state(state.pid, tid)
            if signals is not None:
                return signals
            assert self.helpers is not None
            self.helpers.forget(state.local_rank)
        return _signal_state(state.pid)

    def _check(self, state: _Rank) -> str | None:
        """Why ``state``'s rank must not be asked now, or None. A rank with a helper is asked
        through it, whatever its handler: it needs only its helper thread alive."""
        if state.fd is None:
            return NOT_PYTHON
        if state.exited or state.pid <= 0 or self._supervisor is None:
            return EXITED
        tid = self._thread(state.local_rank)
        if tid is not None:
            if _signal_state(state.pid, tid) is not None:  # the helper is there
                return None
            assert self.helpers is not None
            self.helpers.forget(state.local_rank)  # gone (an exec): the process, as before
        if state.replaced:
            return REPLACED
        signals = self._state(state)
        if signals is None:
            return EXITED
        caught, pending = signals
        if pending:
            return PENDING
        if not caught:
            return NOT_ARMED
        return None

    def read(self, local_rank: int) -> bytes:
        """The rank's dump so far (at most 4 MiB): its helper's answer to the outstanding
        request (:meth:`numarun.stacks.rankhelper.RankHelpers.stacks_dump`), or what the
        file of a rank without a helper holds."""
        fd = self._ranks[local_rank].fd
        if fd is None:
            return b""
        if self._thread(local_rank) is not None:
            assert self.helpers is not None
            return self.helpers.stacks_dump(local_rank, fd)
        size = os.fstat(fd).st_size
        return os.pread(fd, min(size, _MAX_DUMP), 0) if size else b""

    def answer_problem(self, local_rank: int, data: bytes, *, final: bool) -> str | None:
        """Why an asked rank has written no dump (None: it has, or may still). ``final``: no
        more waiting, so a signal still pending means the rank does not answer. Marks a rank
        whose handler was replaced (the signal went, nothing came), so it is not signalled
        again."""
        state = self._ranks[local_rank]
        if data or state.asked_at is None:
            return None
        if self._thread(local_rank) is not None and not state.exited:
            if not final:
                return None
            signals = _signal_state(state.pid, state.pid)
            if signals is not None and signals[1]:
                return PENDING
            if self.awaiting_signal(local_rank) and signals is not None:
                # Signalled, nothing came, nothing pending: the rank's own handler took it.
                # Never signalled again; its helper is still asked.
                state.replaced = True
                return REPLACED
            return UNANSWERED
        signals = self._state(state) if not state.exited else None
        if signals is None:
            return EXITED
        if signals[1]:
            return PENDING if final else None
        if final or time.monotonic() - state.asked_at >= _REPLACED_AFTER:
            state.replaced = True
            state.asked_at = None
            return REPLACED
        return None

    # --- taking -------------------------------------------------------------------------------

    def take_async(
        self,
        done: Callable[[list[Raw]], None],
        local_ranks: Iterable[int] | None = None,
        limit: float = TAKE_LIMIT,
        *,
        stacks: bool = True,
        flight: bool = False,
    ) -> None:
        """Ask ``local_ranks`` (default: all) and call ``done(dumps)`` from the supervisor's
        loop once each dump is complete or ``limit`` seconds passed (module docstring): one
        :class:`Raw` per rank, the problem of those that have none. ``flight``: each rank's
        flight recorder too (:attr:`Raw.flight`), within the same ``limit``; ``stacks``
        False: only that (no signal, :attr:`Raw.text` empty). Never waits; without a
        running supervisor ``done`` may never be called. What ``done`` raises is one warning
        line (:func:`warn_failed`), never the loop's: it is a diagnostic."""
        wanted = self.local_ranks if local_ranks is None else sorted(local_ranks)
        collection = _Collection(self, wanted, limit, stacks=stacks, flight=flight)
        delay = [_POLL]

        def step() -> None:
            try:
                finished = collection.step()
            except Exception:  # the files went with the run (or a dump no check foresaw):
                finished = True  # what was read, the others' problem said in their Raw
            if finished:
                try:
                    done(collection.raw())
                except Exception as error:  # a diagnostic's own bug: never the run's end
                    warn_failed("acting on the ranks' dumps", error, "that diagnostic is lost")
                return
            assert self._supervisor is not None
            self._supervisor.call_later(delay[0], step)
            delay[0] = min(delay[0] * 2, _QUIET_ANY)

        step()

    def take(
        self, local_ranks: Iterable[int] | None = None, limit: float = TAKE_LIMIT
    ) -> list[RankStacks]:
        """Ask ``local_ranks`` (default: all) and wait, at most ``limit`` seconds in all, until
        each dump is complete (see the module docstring); returns one
        :class:`numarun.stacks.parse.RankStacks` per rank, with the problem of those that have
        none. Blocks: for the supervisor's ``on_failure`` only."""
        return self.take_with_flight(local_ranks, limit, flight=False)[0]

    def take_with_flight(
        self, local_ranks: Iterable[int] | None = None, limit: float = TAKE_LIMIT,
        *, flight: bool = True,
    ) -> tuple[list[RankStacks], list[FlightAnswer]]:
        """:meth:`take`, and with ``flight`` each asked rank's flight recorder within the
        same ``limit`` (ranks that could not be asked have none). Blocks: for the
        supervisor's ``on_failure`` only."""
        from numarun.stacks.parse import rank_stacks

        wanted = self.local_ranks if local_ranks is None else sorted(local_ranks)
        collection = _Collection(self, wanted, limit, flight=flight)
        while not collection.step():
            time.sleep(_POLL)
        found = collection.raw()
        stacks = [rank_stacks(item.rank, item.local_rank, item.pid, item.text, item.problem)
                  for item in found]  # fmt: skip
        return stacks, [item.flight for item in found if item.flight is not None]

    def close(self) -> None:
        """Close and remove the files and the directory; idempotent."""
        if self.helpers is not None:
            self.helpers.close()
        for state in self._ranks.values():
            if state.fd is not None:
                forkexec.close(state.fd)
                state.fd = None
        if self.directory is not None:
            remove_files(self.directory)


# --- the runtime directory: the job sockets' (numarun.stacks.channel) and the dumps' ---------


def runtime_dirs() -> list[str]:
    """The places a user's job sockets may be, the one a new job uses first
    (``$NUMARUN_RUNTIME_DIR`` alone when set)."""
    chosen = os.environ.get(RUNTIME_DIR_ENV)
    if chosen:
        return [os.path.abspath(chosen)]
    uid = os.geteuid()
    places = []
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isabs(runtime):
        places.append(os.path.join(runtime, "numarun"))
    places.append(f"/tmp/numarun-{uid}")
    return places


def check_private(path: str) -> None:
    """Raise UsageError unless ``path`` is a real directory (not a symlink) owned by us with no
    access for group or others."""
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UsageError(f"{path} is not a directory (a symbolic link?); remove it")
    if info.st_uid != os.geteuid():
        raise UsageError(
            f"{path} belongs to uid {info.st_uid}, not to you (uid {os.geteuid()}); "
            "numarun will not use it for its job sockets"
        )
    if info.st_mode & 0o077:
        raise UsageError(
            f"{path} is open to other users (mode {stat.S_IMODE(info.st_mode):o}); "
            "make it private: chmod 700"
        )


def runtime_dir(*, create: bool) -> str:
    """The directory a new job's socket and dump files go to, made (0700) and checked.

    Raises UsageError (one line) when it cannot be made or fails the checks."""
    path = runtime_dirs()[0]
    if create:
        parent = os.path.dirname(path)
        try:
            if not os.path.isdir(parent):
                path = runtime_dirs()[-1]  # XDG_RUNTIME_DIR names a directory that is gone
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as error:
            raise UsageError(f"cannot create {path}: {error.strerror}") from None
    try:
        check_private(path)
    except FileNotFoundError:
        raise UsageError(f"{path} does not exist") from None
    return path
