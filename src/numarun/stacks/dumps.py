"""The launcher's side of stack dumps: take every rank's Python stacks on demand, at a failure and
on a hang, through one :class:`numarun.process.supervisor.Supervisor` and without threads.

Mechanism. Each rank's bootstrap (:mod:`numarun.stacks.arm`) registers :mod:`faulthandler` on
signal 42 (:data:`STACKS_SIGNAL`), writing to one file per rank in a private directory of the
launcher's (``<runtime dir>/<job>.d/rank<local rank>``, 0700, in the per-user directory of
:mod:`numarun.stacks.channel`). To take stacks, the launcher empties a rank's file, sends signal 42
to the rank process through :meth:`Supervisor.send_signal` (workers only, never exited ones, never
their children: a DataLoader worker forked from a rank inherits the registration but is never
signalled), and reads the file back. faulthandler writes from its C signal handler, so a rank
blocked in a collective or holding the GIL answers too; nothing goes to its stdout/stderr.

Safety. Signal 42 kills by default, so it is sent only to a rank whose ``/proc/<pid>/status``
shows it caught (``SigCgt``) -- not yet armed (interpreter start-up) or running another program
after ``exec`` means no signal -- and not while a previous one is still pending (``ShdPnd``).
The remaining window is the few microseconds between that read and the signal, in which a
rank would have to ``exec``. A rank whose own code took the signal over (its handler replaced
numarun's: the user's handler wins) is reported as such and not signalled again in this run.

When a dump is complete. faulthandler writes no end marker. A dump is taken as complete when
its last line is the bottom of the main thread (listed last, so written last), which for both
bootstraps is their ``-c`` code (``File "<string>", line 1 in <module>``), or faulthandler's
``...`` after 100 threads; any other dump that ends with a newline and has not
grown for 25 ms is taken too (a fork worker's, a stack deeper than 100 frames).
:meth:`RankDumps.take` waits at most ``limit`` seconds (1 s) for all ranks together, typically
a few milliseconds.

Hang rule (``--hang-timeout SECONDS``, :class:`HangWatch`): every ``interval`` seconds (``timeout /
100``, between 1 and 2 s; at least 1 s per 8 ranks) the dumps asked for at the previous tick are
read and new ones are asked for: nothing waits. Progress is any of: a rank's stacks differ from its
previous sample (every thread's file, line and function), a byte of output from any rank that
numarun reads (``--redirects``/``--tee``/``--local-ranks-filter``; output that goes straight to the
terminal is invisible to the launcher), a rank that exited, a rank not yet armed. A hang is declared
once nothing progressed for ``timeout`` seconds; a rank whose own code took signal 42 over and a
``--no-python`` rank are judged by their output alone, a rank that does not answer counts as not
moving, and a job in which nothing at all can be observed is never declared hung.

Limits, and how to choose the timeout. Samples are instants: a rank that spends a fraction
``p`` of its time on one line (a training step that waits at ``loss.item()`` for the GPU, one
long C call) shows the same stack in all ``n = timeout / interval`` samples of a window with
probability ``p ** n``, and then looks hung. Choose a timeout many steps long (300 s on 8
ranks: 150 samples; ``0.95 ** 150`` is 5e-4 per window), let numarun read the output (``--tee``/
``--redirects``) when the job logs regularly, and expect a single C call longer than the
timeout (a blocking read, a huge matmul) to look hung. Conversely a rank that loops on one
line (``while not ready: time.sleep(1)``) looks still: that is a hang by this rule.

Cost: per tick and rank, one read of ``/proc/<pid>/status``, one signal, one read and one
truncation of a small file in the launcher, and one faulthandler dump (tens of microseconds)
in the rank; ``benchmarks/bench_stacks.py`` measures the launcher's CPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence

from numarun.errors import NumarunError
from numarun.process import children
from numarun.stacks.arm import STACKS_FILE_ENV, STACKS_SIGNAL

TYPE_CHECKING = False  # typing is not imported at run time: the launcher's start-up path
if TYPE_CHECKING:
    from typing import Any

    from numarun.process.spec import WorkerExit
    from numarun.process.supervisor import Supervisor
    from numarun.stacks.parse import RankStacks

HANG_REASON = "hang: "  # RunResult.stop_reason of a run ended by HangWatch starts with this
HANG_EXIT_CODE = 124  # as timeout(1): "the command timed out"
TAKE_LIMIT = 1.0  # seconds to wait for every rank's dump together
_MAX_DUMP = 4 * 1024 * 1024  # faulthandler's own limits keep a dump far below this
_POLL = 0.001
_QUIET_ANY = 0.025
_REPLACED_AFTER = 0.1  # signal delivered, file still empty this long: someone else's handler
_SIG_BIT = 1 << (STACKS_SIGNAL - 1)

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


def _signal_state(pid: int) -> tuple[bool, bool] | None:
    """(caught, pending) for :data:`STACKS_SIGNAL` from ``/proc/<pid>/status``; None when the
    process is gone or a zombie."""
    try:
        fd = os.open(f"/proc/{pid}/status", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 16384)
    except OSError:
        return None
    finally:
        os.close(fd)
    caught = pending = False
    start = data.find(b"\nShdPnd:")
    if start >= 0:
        pending = bool(int(data[start + 8 : data.index(b"\n", start + 1)], 16) & _SIG_BIT)
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


def normalized(dump: bytes) -> bytes:
    """A dump without what changes when nothing moved: which thread ran the handler."""
    return dump.replace(b"Current thread ", b"Thread ")


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
    open); :meth:`close` closes and removes them.
    """

    def __init__(self, ranks: Sequence[tuple[int, int]], directory: str | None) -> None:
        self.directory = directory
        self._ranks: dict[int, _Rank] = {}
        self._supervisor: Supervisor | None = None
        try:
            for local_rank, rank in ranks:
                fd = None
                if directory is not None:
                    fd = os.open(
                        self.path(local_rank),
                        os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                        0o600,
                    )
                    children.track(fd)  # forked workers close it
                self._ranks[local_rank] = _Rank(local_rank, rank, fd)
        except BaseException:
            self.close()
            raise

    def path(self, local_rank: int) -> str:
        assert self.directory is not None
        return os.path.join(self.directory, f"rank{local_rank}")

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
        """Empty each rank's file and send it signal 42; returns the problem of each rank that
        was not asked (not Python, exited, not armed, signal pending, handler replaced)."""
        self._refresh_pids()
        problems: dict[int, str] = {}
        ready: list[int] = []
        for local_rank in self.local_ranks if local_ranks is None else local_ranks:
            problem = self._check(self._ranks[local_rank])
            if problem is None:
                ready.append(local_rank)
            else:
                problems[local_rank] = problem
        if ready:
            assert self._supervisor is not None
            for local_rank in ready:
                fd = self._ranks[local_rank].fd
                assert fd is not None
                os.ftruncate(fd, 0)
            reached = set(self._supervisor.send_signal(STACKS_SIGNAL, ready))
            now = time.monotonic()
            for local_rank in ready:
                if local_rank in reached:
                    self._ranks[local_rank].asked_at = now
                else:
                    problems[local_rank] = EXITED
        return problems

    def _check(self, state: _Rank) -> str | None:
        """Why ``state``'s rank must not be signalled now, or None."""
        if state.fd is None:
            return NOT_PYTHON
        if state.exited or state.pid <= 0 or self._supervisor is None:
            return EXITED
        if state.replaced:
            return REPLACED
        signals = _signal_state(state.pid)
        if signals is None:
            return EXITED
        caught, pending = signals
        if pending:
            return PENDING
        if not caught:
            return NOT_ARMED
        return None

    def read(self, local_rank: int) -> bytes:
        """What the rank's file holds now (at most 4 MiB)."""
        fd = self._ranks[local_rank].fd
        if fd is None:
            return b""
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
        signals = _signal_state(state.pid) if not state.exited else None
        if signals is None:
            return EXITED
        if signals[1]:
            return PENDING if final else None
        if final or time.monotonic() - state.asked_at >= _REPLACED_AFTER:
            state.replaced = True
            state.asked_at = None
            return REPLACED
        return None

    # --- taking, with a bounded wait -------------------------------------------------------------

    def take(
        self, local_ranks: Iterable[int] | None = None, limit: float = TAKE_LIMIT
    ) -> list[RankStacks]:
        """Ask ``local_ranks`` (default: all) and wait, at most ``limit`` seconds in all, until
        each dump is complete (see the module docstring); returns one
        :class:`numarun.stacks.parse.RankStacks` per rank, with the problem of those that have
        none."""
        from numarun.stacks.parse import rank_stacks

        wanted = self.local_ranks if local_ranks is None else sorted(local_ranks)
        problems = self.ask(wanted)
        texts: dict[int, bytes] = {}
        pending = [r for r in wanted if r not in problems]
        deadline = time.monotonic() + limit
        seen: dict[int, tuple[int, float]] = {}  # local rank -> (size, when it last changed)
        while pending:
            now = time.monotonic()
            for local_rank in list(pending):
                data = self.read(local_rank)
                size, since = seen.get(local_rank, (-1, now))
                if len(data) != size:
                    seen[local_rank] = (len(data), now)
                    since = now
                done = _structurally_complete(data) or (
                    data.endswith(b"\n") and now - since >= _QUIET_ANY
                )
                problem = None if data else self.answer_problem(local_rank, data, final=False)
                if done or problem is not None:
                    pending.remove(local_rank)
                    texts[local_rank] = data
                    if problem is not None:
                        problems[local_rank] = problem
            if not pending:
                break
            if now >= deadline:
                for local_rank in pending:
                    data = self.read(local_rank)
                    texts[local_rank] = data
                    problems[local_rank] = (
                        f"incomplete: the dump was still being written after {limit:g} s"
                        if data
                        else self.answer_problem(local_rank, data, final=True)
                        or f"no dump within {limit:g} s"
                    )
                break
            time.sleep(_POLL)
        return [
            rank_stacks(
                self._ranks[r].rank,
                r,
                self._ranks[r].pid or None,
                texts.get(r, b"").decode("utf-8", "replace"),
                problems.get(r),
            )
            for r in wanted
        ]

    def close(self) -> None:
        """Close and remove the files and the directory; idempotent."""
        for state in self._ranks.values():
            if state.fd is not None:
                children.close(state.fd)
                state.fd = None
        if self.directory is not None:
            for name in os.listdir(self.directory) if os.path.isdir(self.directory) else ():
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.directory, name))
            with contextlib.suppress(OSError):
                os.rmdir(self.directory)


class HangReport:
    """What :class:`HangWatch` saw when it declared the hang: ``stacks`` of every rank (the
    last samples), ``idle`` seconds without progress, and whether output counted."""

    def __init__(
        self, timeout: float, idle: float, stacks: Sequence[RankStacks], output_watched: bool
    ) -> None:
        self.timeout = timeout
        self.idle = idle
        self.stacks = stacks
        self.output_watched = output_watched


class HangWatch:
    """``--hang-timeout``: samples every rank's stacks on the supervisor's timer and stops the
    run through :meth:`Supervisor.request_stop` (``"hang: ..."``) when nothing progressed for
    ``timeout`` seconds (the rule is in the module docstring). ``report`` is then set."""

    def __init__(self, dumps: RankDumps, timeout: float, *, output_watched: bool) -> None:
        self.dumps = dumps
        self.timeout = float(timeout)
        # timeout / 100 between 1 and 2 s, and at least 1 s per 8 ranks: the launcher's CPU
        # stays near 0.5 ms per second of wall time whatever the number of ranks.
        ranks = len(dumps.local_ranks)
        self.interval = max(min(max(self.timeout / 100, 1.0), 2.0), ranks / 8)
        self.output_watched = output_watched
        self.report: HangReport | None = None
        self._output = 0
        self._seen_output = 0
        self._last: dict[int, bytes] = {}
        self._exited: set[int] = set()
        self._unasked: dict[int, str] = {}  # local rank -> why the last tick did not ask it
        self._progress_at = time.monotonic()
        self._supervisor: Supervisor | None = None

    def count_output(self, sinks: Iterable[Any]) -> None:
        """Count what these output sinks receive as progress. The sink's own ``feed`` is
        wrapped on the instance, so the sink keeps its type
        (:func:`numarun.process.sinks.log_loss`)."""
        for sink in sinks:
            if sink is None:
                continue
            inner = sink.feed

            def feed(data: bytes, inner: Callable[[bytes], None] = inner) -> None:
                self._output += 1
                inner(data)

            sink.feed = feed

    def attach(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor
        self._progress_at = time.monotonic()
        supervisor.call_every(self.interval, self.tick)

    def tick(self) -> None:
        """Read the dumps asked for at the last tick, judge progress, ask again. An I/O error
        skips this tick (an exception here would end the job)."""
        with contextlib.suppress(OSError):
            self._tick()

    def _tick(self) -> None:
        now = time.monotonic()
        dumps = self.dumps
        progress = self._output != self._seen_output
        self._seen_output = self._output
        observable = self.output_watched
        for local_rank in dumps.local_ranks:
            state = dumps._ranks[local_rank]
            if state.exited:
                if local_rank not in self._exited:
                    self._exited.add(local_rank)
                    progress = True
                continue
            if state.fd is None or state.replaced:
                continue  # judged by its output alone
            unasked = self._unasked.get(local_rank)
            if unasked == NOT_ARMED:
                progress = True  # still starting up (or exec'd): not hung
                continue
            if unasked == PENDING:
                observable = True  # does not answer: counts as not moving
                continue
            if state.asked_at is None:
                continue  # first tick: nothing asked yet
            data = dumps.read(local_rank)
            problem = None if data else dumps.answer_problem(local_rank, data, final=True)
            if problem == PENDING:
                observable = True
                continue
            if not data:
                continue
            observable = True
            sample = normalized(data)
            if self._last.get(local_rank) != sample:
                self._last[local_rank] = sample
                progress = True
        if progress or not observable:
            self._progress_at = now
        elif now - self._progress_at >= self.timeout:
            self._declare(now)
            return
        self._unasked = dumps.ask(dumps.live())

    def _declare(self, now: float) -> None:
        from numarun.stacks.parse import rank_stacks

        dumps = self.dumps
        stacks = []
        for local_rank in dumps.local_ranks:
            state = dumps._ranks[local_rank]
            problem = None
            if state.fd is None:
                problem = NOT_PYTHON
            elif state.exited:
                problem = EXITED
            elif state.replaced:
                problem = REPLACED
            text = self._last.get(local_rank, b"") if problem is None else b""
            if problem is None and not text:
                problem = PENDING
            stacks.append(
                rank_stacks(
                    state.rank, local_rank, state.pid or None, text.decode("utf-8", "replace"),
                    problem,
                )
            )  # fmt: skip
        idle = now - self._progress_at
        self.report = HangReport(self.timeout, idle, stacks, self.output_watched)
        assert self._supervisor is not None
        self._supervisor.request_stop(
            f"{HANG_REASON}no rank made progress for {idle:.1f} s (--hang-timeout {self.timeout:g})"
        )


class JobStacks:
    """Everything stacks need for one job: the dump files (:class:`RankDumps`), the
    ``numarun stacks`` socket (:class:`numarun.stacks.channel.JobServer`), the hang watch and the
    stacks taken at the first failure. Made before the workers (their environment needs
    :meth:`worker_env`), attached to the supervisor, closed at the end."""

    def __init__(
        self,
        ranks: Sequence[tuple[int, int]],
        *,
        python: bool,
        describe: Mapping[str, object],
        hang_timeout: float | None = None,
        close_when_done: bool = False,
    ) -> None:
        from numarun.stacks import channel

        self.runtime_dir = channel.runtime_dir(create=True)
        self.name = f"{os.getpid()}-{os.urandom(4).hex()}"
        directory = None
        if python:
            directory = os.path.join(self.runtime_dir, f"{self.name}.d")
            os.mkdir(directory, 0o700)
        try:
            self.dumps = RankDumps(ranks, directory)
        except BaseException:
            if directory is not None:
                os.rmdir(directory)
            raise
        self.describe = {**describe, "name": self.name, "pid": os.getpid(),
                         "started": time.time()}  # fmt: skip
        self.hang = (
            HangWatch(self.dumps, hang_timeout, output_watched=False) if hang_timeout else None
        )
        self.at_failure: tuple[WorkerExit, list[RankStacks]] | None = None
        self._close_when_done = close_when_done
        self._server: Any = None
        self._supervisor: Supervisor | None = None

    def worker_env(self, local_rank: int) -> dict[str, str]:
        return self.dumps.worker_env(local_rank)

    def count_output(self, sinks: Iterable[Any]) -> None:
        """Output through these sinks counts as progress for ``--hang-timeout``."""
        if self.hang is not None:
            present = [sink for sink in sinks if sink is not None]
            if present:
                self.hang.output_watched = True
                self.hang.count_output(present)

    def attach(self, supervisor: Supervisor) -> None:
        """Before :meth:`Supervisor.run`: the hang timer; the socket opens in :meth:`listen`."""
        self._supervisor = supervisor
        self.dumps.attach(supervisor)
        if self.hang is not None:
            self.hang.attach(supervisor)

    def listen(self) -> None:
        """Open the ``numarun stacks`` socket and watch it from the supervisor's loop (called
        once the workers started: nothing of it delays them)."""
        from numarun.stacks import channel

        assert self._supervisor is not None
        self._server = channel.JobServer(self.runtime_dir, self.name, self._answer)
        self._server.attach(self._supervisor)

    def on_exit(self, ended: WorkerExit) -> None:
        """The supervisor's ``on_exit``; with ``close_when_done``, the last rank's end closes
        everything (the :func:`numarun.spawn` case: no launcher around it to do so)."""
        self.dumps.note_exit(ended)
        if self._close_when_done and not self.dumps.live():
            self.close()

    def on_failure(self, ended: WorkerExit) -> None:
        """The supervisor's ``on_failure``: the other ranks' stacks, before anyone is signalled
        (at most :data:`TAKE_LIMIT` seconds)."""
        self.dumps.note_exit(ended)
        others = [r for r in self.dumps.live() if r != ended.local_rank]
        with contextlib.suppress(OSError):  # no stacks then: the teardown must go on
            self.at_failure = (ended, self.dumps.take(others) if others else [])

    def _answer(self, op: str) -> dict[str, object]:
        info: dict[str, object] = {
            **self.describe,
            "ranks": [
                {"local_rank": r, "rank": self.dumps._ranks[r].rank,
                 "pid": self.dumps._ranks[r].pid or None}
                for r in self.dumps.local_ranks
            ],
        }  # fmt: skip
        if op != "stacks":
            return info
        taken = self.dumps.take()
        info["dumps"] = [
            {
                "rank": item.rank,
                "local_rank": item.local_rank,
                "pid": item.pid,
                "problem": item.problem,
                "text": item.text,
            }
            for item in taken
        ]
        return info

    def summary_fields(self, attempt_dir: str | None) -> dict[str, object]:
        """Keyword arguments for :func:`numarun.launch.failures.format_summary`: the hang report or
        the stacks taken at the first failure; with ``attempt_dir`` (the run's kept log
        directory) each rank's full stacks are written to ``<attempt_dir>/<local rank>/
        stacks.log`` first."""
        fields: dict[str, object] = {}
        if self.hang is not None and self.hang.report is not None:
            report = self.hang.report
            fields["hang"] = report
            stacks = report.stacks
            header = f"when --hang-timeout {report.timeout:g} found the job hung"
        elif self.at_failure is not None:
            ended, stacks = self.at_failure
            fields["stacks_at_failure"] = (ended.rank, stacks)
            header = f"when rank {ended.rank} failed"
        else:
            return fields
        if stacks and attempt_dir is not None:
            log_dirs = {item.local_rank: os.path.join(attempt_dir, str(item.local_rank))
                        for item in stacks}  # fmt: skip
            if write_stacks_files(log_dirs, stacks, header):
                fields["stacks_logs"] = os.path.join(attempt_dir, "<local_rank>", "stacks.log")
        return fields

    def close(self) -> None:
        """Close the socket and remove the dump files; idempotent."""
        if self._close_when_done:
            import atexit

            atexit.unregister(self.close)
        if self._server is not None:
            self._server.close(self._supervisor)
            self._server = None
        self.dumps.close()


def write_stacks_files(
    log_dirs: Mapping[int, str], stacks: Sequence[RankStacks], header: str
) -> list[str]:
    """Each rank's full dump (as faulthandler wrote it) to ``<its log dir>/stacks.log`` after a
    ``# numarun: ...`` header line; returns the paths written. Errors are skipped: a full disk
    must not hide the summary."""
    written = []
    for item in stacks:
        directory = log_dirs.get(item.local_rank)
        if directory is None:
            continue
        path = os.path.join(directory, "stacks.log")
        body = item.text if item.text else f"(no stacks: {item.problem})\n"
        try:
            with open(path, "w", encoding="utf-8") as file:
                file.write(
                    f"# numarun: rank {item.rank} (local_rank {item.local_rank}, pid "
                    f"{item.pid}) {header}\n{body}"
                )
        except OSError:
            continue
        written.append(path)
    return written


def for_spawn(specs: Sequence[Any], fn: object) -> tuple[list[Any], JobStacks | None]:
    """:func:`numarun.spawn`'s workers with their dump files added to their environment, and
    the :class:`JobStacks` to attach (``numarun stacks`` answers while the parent waits in
    ``join``); it closes itself when the last worker ends, or at interpreter exit. Where
    stacks cannot be set up, the specs unchanged, None, and a :class:`RuntimeWarning`."""
    import dataclasses

    name = getattr(fn, "__qualname__", None) or type(fn).__name__
    try:
        job = JobStacks(
            [(spec.local_rank, spec.rank) for spec in specs],
            python=True,
            describe={"run_id": f"spawn-{os.getpid()}", "host": os.uname().nodename,
                      "entrypoint": f"numarun.spawn({name}) in {' '.join(sys.argv)[:150]}"},
            close_when_done=True,
        )  # fmt: skip
    except (NumarunError, OSError) as error:
        import warnings

        warnings.warn(f"`numarun stacks` will not reach these workers: {error}",
                      RuntimeWarning, stacklevel=3)  # fmt: skip
        return list(specs), None
    import atexit

    atexit.register(job.close)
    env = job.worker_env
    return [dataclasses.replace(s, env={**s.env, **env(s.local_rank)}) for s in specs], job
