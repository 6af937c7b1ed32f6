"""Start workers bound at birth, watch them without polling, and tear whole process trees down.

Every way numarun starts workers (the launcher's argv workers, :func:`numarun.spawn`) goes
through one :class:`Supervisor`. A worker is described by a :class:`WorkerSpec` and started one
of three ways (``WorkerSpec.start``):

* ``"exec"``: fork, then ``execve`` of ``argv``. ``argv[0]`` is looked up on the ``PATH`` of
  the worker's environment before anything starts. All workers are forked back to back, then
  :meth:`Supervisor.start` waits for all their execs at once (a close-on-exec pipe each); an
  exec or binding error in a child is raised from ``start``.
* ``"fork"``: ``os.fork()``, then ``fork_target(payload_fd, result_fd)`` in the child; its
  return value is the exit status. ``os.environ`` is replaced by the spec's environment in the
  child only.
* ``"forkserver"``: :mod:`multiprocessing`'s forkserver forks the child, so inherited affinity
  cannot work; ``fork_target`` must be a picklable module-level function. Its stdout/stderr
  without a sink are the forkserver's (the supervisor's fds 1 and 2 when the forkserver
  started).

What each child runs before ``execve`` or ``fork_target`` and in what order (``setsid()``,
``PR_SET_PDEATHSIG(SIGKILL)``, a check that its parent is still the supervisor or the
forkserver, binding, stdio, closing fds, ``chdir``, ...), and how ``fork_target``'s outcome
becomes the exit status, is :mod:`numarun.children`; so is the registry of the fds supervisors
hold, which forked children close.

Workers run with ``NUMARUN_RUN_ID=<run id>`` added to their environment. ``payload`` is written
by the supervisor to a pipe (exec: fd number in ``NUMARUN_PAYLOAD_FD``; fork/forkserver:
``payload_fd``, -1 when there is no payload), then closed so the child sees end of file; it is
written during :meth:`Supervisor.start`, to all workers at once, so workers run as soon as
``start`` returns, joined or not (what a child has not read within a minute is left to the
loop). ``pass_fds``: fds of the caller's that the worker gets too (exec: open at the same
numbers; fork: kept open; forkserver: handed over by the forkserver), listed for the child in
:data:`numarun.children.passed_fds` (fork/forkserver); the caller keeps and closes its own.
``want_result`` gives the child a pipe (exec: ``NUMARUN_RESULT_FD``; fork/forkserver:
``result_fd``, else -1) whose bytes, up to the worker's death, become ``WorkerExit.result``.

Watching is one :mod:`selectors` loop over each worker's pidfd (forkserver: the
:class:`multiprocessing.Process` sentinel), output, payload and result pipes, the console while
tee'd output waits for it (a sink's ``console``, :class:`numarun.logs.Console`: nothing in the
loop ever blocks on a slow terminal) and, in the main thread, a socket that
``signal.set_wakeup_fd`` writes to; timers are the select timeout.
Fallback where ``os.pidfd_open`` is missing or fails with ENOSYS: in the main thread SIGCHLD
wakes the loop, which then calls ``waitpid(pid, WNOHANG)`` for each worker; outside it, and for
descendants during teardown, the loop checks every 50 ms. It never calls ``waitpid(-1)``.

Ownership and teardown: while it runs, the supervisor is a child subreaper (the previous setting
is restored afterwards), so orphaned descendants come back to it. A process is owned when it
descends (by ``/proc`` parent links) from a live worker, when its session id is a worker's pid,
or when ``/proc/<pid>/environ`` holds this run's ``NUMARUN_RUN_ID``; never the supervisor, its
ancestors or its watchdog. Teardown sends SIGTERM to each live worker's process group and every
owned process, waits until all are gone or ``grace_period`` passed, then sends SIGKILL to all
owned processes and sweeps again until none is left, waiting at most ``kill_wait`` seconds. A
worker still alive then (uninterruptible sleep) is reported as ``"unkillable"`` with its
``/proc`` state letter and the call returns anyway. Direct children and owned zombies adopted as
subreaper are reaped. After a successful run, owned leftovers (daemonized grandchildren) are
torn down the same way. Each sweep reads /proc before signalling, while parent links to live
workers still exist. Limits: an adopted orphan that left the workers' sessions and exited on
its own before any sweep saw it cannot be proven ours (a zombie has no readable environment)
and is left to the caller's process to reap; a descendant of a ``"fork"`` or ``"forkserver"``
worker (never exec'd, so no marker in its ``/proc`` environ) that left the session is found
only while its chain of parents up to a live worker is intact.

If the supervisor dies, even by SIGKILL, workers get SIGKILL from the kernel
(``PR_SET_PDEATHSIG``) and a watchdog process (:mod:`numarun.watchdog`) kills the rest.
``PR_SET_PDEATHSIG`` follows the *thread* that created the worker: call :meth:`Supervisor.start`
from a thread that lives as long as the workers (the one that waits).

Signals, only in the main thread, while :meth:`Supervisor.start`, :meth:`Supervisor.wait` or
:meth:`Supervisor.run` (both under one scope, so nothing falls between them) runs:
``teardown_signals`` make it tear down and return with ``RunResult.received_signal`` set (a
second one skips the rest of the grace period; one that arrives during ``start`` is acted on by
the next ``wait``); ``forward_signals`` are sent to every live worker and the run goes on. The
previous handlers and wakeup fd are restored when each call returns. Left alone: a teardown
signal the caller ignores, when it is in ``keep_ignored`` (SIGHUP under ``nohup``: the job
survives the hangup), and a signal whose handler was not installed from Python
(``signal.getsignal`` is None). With ``relay_signal`` a signal-caused teardown sends the
received signal first (SIGINT reaches the workers as SIGINT), SIGKILL after the grace period.

The caller's CPU affinity, memory policy, environment and signal handlers are never changed;
no files are created (``"forkserver"`` starts :mod:`multiprocessing`'s forkserver once per
process, with its socket in a temporary directory that multiprocessing removes at exit); every
fd opened is closed when the run ends.
"""

from __future__ import annotations

import contextlib
import errno
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from numarun import binding, children, watchdog
from numarun.errors import BindingError, UsageError

if TYPE_CHECKING:
    from numarun.binding import MemPolicy

RUN_ID_ENV = watchdog.RUN_ID_ENV
PAYLOAD_FD_ENV = "NUMARUN_PAYLOAD_FD"
RESULT_FD_ENV = "NUMARUN_RESULT_FD"
START_METHODS = ("exec", "fork", "forkserver")

SUCCEEDED = "succeeded"
FAILED = "failed"
TERMINATED = "terminated"
UNKILLABLE = "unkillable"

_READ_SIZE = 256 * 1024
_FALLBACK_TICK = 0.05  # only without pidfds (see the module docstring)
_WATCHDOG_WAIT = 2.0
_EXEC_LIMIT = 60.0  # seconds from fork to exec before start() gives up

# The subreaper flag is per process: the first running supervisor sets it, the last restores it.
_subreaper_lock = threading.Lock()
_subreaper_users = 0
_subreaper_previous = False

_pidfd_available = hasattr(os, "pidfd_open")


class OutputSink(Protocol):
    """Where one stream (stdout or stderr) of one worker goes; see :mod:`numarun.logs`."""

    def feed(self, data: bytes) -> None:
        """Raw chunks of the stream, in order, called from the supervisor loop."""

    def close(self) -> None:
        """End of file on the stream; called exactly once."""


@dataclass(frozen=True)
class WorkerSpec:
    """One worker to start. See the module docstring for ``start``, ``payload``, ``want_result``.

    ``env`` is the worker's complete environment (the supervisor adds ``NUMARUN_RUN_ID`` and the
    pipe fd variables); ``cpus`` None inherits the supervisor's affinity; ``mem`` None leaves the
    memory policy inherited; ``stdout``/``stderr`` None let the worker inherit fd 1/2 untouched.
    """

    local_rank: int
    rank: int
    env: Mapping[str, str]
    argv: Sequence[str] | None = None
    start: str = "exec"
    fork_target: Callable[[int, int], int] | None = None
    payload: bytes | None = None
    want_result: bool = False
    cpus: Sequence[int] | None = None
    mem: MemPolicy | None = None
    stdout: OutputSink | None = None
    stderr: OutputSink | None = None
    cwd: str | None = None
    pass_fds: Sequence[int] = ()


@dataclass(frozen=True)
class WorkerExit:
    """How one worker ended.

    ``exit_code`` follows :class:`subprocess.Popen`: >= 0 exit status, -N killed by signal N,
    None when it could not be killed. ``state``: ``"succeeded"`` (exit 0 before any teardown),
    ``"failed"`` (ended on its own with a non-zero status, or ``is_failure`` said so; also a
    worker that, after our SIGTERM, exited with a status in 1..127), ``"terminated"`` (ended
    by our teardown: killed by a signal, status 0 or >= 128 after we signalled it),
    ``"unkillable"`` (alive ``kill_wait`` seconds after SIGKILL; ``proc_state`` is its
    ``/proc/<pid>/stat`` state letter, e.g. ``"D"``). ``ended_at`` is ``time.time()`` when the
    death was observed (None for unkillable workers).
    """

    local_rank: int
    rank: int
    pid: int
    exit_code: int | None
    signal_name: str | None
    state: str
    ended_at: float | None
    result: bytes = b""
    proc_state: str | None = None


@dataclass(frozen=True)
class RunResult:
    """The end of a run: ``workers`` by local rank; ``first_failure`` the first ``"failed"``
    worker in time (teardown kills never count); ``received_signal`` the signal that made the
    supervisor tear down, if any; ``unkillable`` the workers that survived SIGKILL;
    ``stop_reason`` the reason given to :meth:`Supervisor.request_stop` when that call began the
    teardown (a failure or signal that came first wins), else None."""

    workers: list[WorkerExit]
    first_failure: WorkerExit | None
    received_signal: int | None
    unkillable: list[WorkerExit]
    stop_reason: str | None = None


class _Worker:
    """Mutable bookkeeping for one started worker (the loop's view of it)."""

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.pid = 0
        self.exec_check_fd: int | None = None  # start="exec": EOF once the child exec'd
        self.process: Any = None  # multiprocessing.Process for start="forkserver"
        self.exit_fd: int | None = None  # pidfd (or the forkserver sentinel) in the selector
        self.owns_exit_fd = False
        self.exit_code: int | None = None
        self.exited = False
        self.ended_at: float | None = None
        self.signalled = False
        self.payload_fd: int | None = None
        self.payload_view: memoryview | None = None
        self.result_fd: int | None = None
        self.result = bytearray()
        self.outputs: dict[int, OutputSink] = {}
        self.state: str | None = None
        self.proc_state: str | None = None

    def poll(self) -> int | None:
        """The exit code if the worker has ended (reaping it), else None; never blocks."""
        if self.exited:
            return self.exit_code
        if self.process is not None:
            return self.process.exitcode
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return -signal.SIGKILL  # reaped by someone else; we cannot know its status
        if pid == 0:
            return None
        return os.waitstatus_to_exitcode(status)


# --- fds -----------------------------------------------------------------------------------------


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None where pidfds do not work (then the fallback is used).

    Raises ProcessLookupError when ``pid`` does not exist.
    """
    global _pidfd_available
    if not _pidfd_available:
        return None
    try:
        return children.track(os.pidfd_open(pid))
    except ProcessLookupError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            _pidfd_available = False
            return None
        raise


# --- the supervisor ------------------------------------------------------------------------------


def signal_name(code: int | None) -> str | None:
    """``"SIGSEGV"`` for exit code -11 (Popen convention); ``"SIG<n>"`` for a signal without a
    name; None for a code that is not a signal death (None or >= 0)."""
    if code is None or code >= 0:
        return None
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"SIG{-code}"


def _resolve_program(program: str, env: Mapping[str, str]) -> str | None:
    """Where ``execve`` would find ``program`` on ``env``'s PATH; None when nowhere."""
    candidates = (
        [program]
        if os.path.dirname(program)
        else [os.path.join(d or ".", program) for d in os.get_exec_path(dict(env))]
    )
    for path in candidates:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return os.path.abspath(path)  # the child may chdir before exec
    return None


def _validate_spec(spec: WorkerSpec) -> str:
    """Raise UsageError/BindingError (one line) for a spec that cannot start; starts nothing.
    Returns the program to exec (``start="exec"``), else ''."""
    who = f"local rank {spec.local_rank}"
    resolved = ""
    if spec.start not in START_METHODS:
        raise UsageError(
            f"{who}: unknown start method {spec.start!r}; use one of {', '.join(START_METHODS)}"
        )
    if spec.start == "exec":
        if not spec.argv:
            raise UsageError(f"{who}: start='exec' needs a non-empty argv")
        program = spec.argv[0]
        if spec.cwd is not None and os.path.dirname(program):
            program = os.path.join(spec.cwd, program)  # the child chdirs before exec
        resolved = _resolve_program(program, spec.env)
        if resolved is None:
            raise UsageError(
                f"{who}: cannot run {spec.argv[0]!r}: not an executable file"
                + ("" if os.path.dirname(spec.argv[0]) else " on the worker's PATH")
                + "; give the full path or fix PATH"
            )
    elif not callable(spec.fork_target):
        raise UsageError(f"{who}: start={spec.start!r} needs a callable fork_target")
    if spec.payload is not None and not isinstance(spec.payload, (bytes, bytearray, memoryview)):
        raise UsageError(f"{who}: payload must be bytes, not {type(spec.payload).__name__}")
    if not all(isinstance(fd, int) and fd >= 0 for fd in spec.pass_fds):
        raise UsageError(f"{who}: pass_fds must be fd numbers >= 0, got {spec.pass_fds!r}")
    if spec.cwd is not None and not os.path.isdir(spec.cwd):
        raise UsageError(f"{who}: working directory {spec.cwd!r} does not exist")
    if spec.cpus is not None:
        binding.check_cpus(spec.cpus, rank=spec.local_rank)
    return resolved


def _check_signals(teardown: Sequence[int], forward: Sequence[int]) -> None:
    uncatchable = {signal.SIGKILL, signal.SIGSTOP}
    for signum in (*teardown, *forward):
        if signum in uncatchable or signum == signal.SIGCHLD:
            raise UsageError(f"signal {signum} cannot be handled by the supervisor")
    both = set(teardown) & set(forward)
    if both:
        raise UsageError(
            f"signal(s) {sorted(both)} are both teardown and forward signals; choose one"
        )


def _acquire_subreaper() -> None:
    global _subreaper_users, _subreaper_previous
    with _subreaper_lock:
        if _subreaper_users == 0:
            _subreaper_previous = binding.set_child_subreaper(True)
        _subreaper_users += 1


def _release_subreaper() -> None:
    global _subreaper_users
    with _subreaper_lock:
        _subreaper_users -= 1
        if _subreaper_users == 0 and not _subreaper_previous:
            binding.set_child_subreaper(False)


_NEW, _RUNNING, _TERMINATING, _KILLING, _DRAINING, _DONE = range(6)


class Supervisor:
    """Starts the workers of ``specs``, watches them, and tears them down (module docstring).

    ``grace_period``: seconds between SIGTERM and SIGKILL in a teardown (may be changed
    before :meth:`wait`/:meth:`stop`). ``kill_wait``: seconds to wait after SIGKILL before a
    survivor is reported unkillable. ``is_failure(exit)``: also count a worker that exited 0
    as failed (the spawn API: a callable that reported an exception). ``on_exit(exit)`` is called
    from the loop as each worker's end is observed. ``kill(pid, signum)`` sends every signal the
    supervisor sends (a negative pid is a process group, as for ``os.kill``); tests replace it.
    ``use_watchdog``: start the watchdog process (see :mod:`numarun.watchdog`).
    ``relay_signal``: a teardown caused by a teardown signal sends that signal first (SIGINT
    after Ctrl-C, so that workers' ``except KeyboardInterrupt`` runs, as under torchrun);
    otherwise, and after a failure or :meth:`stop`, the first signal is SIGTERM.
    ``keep_ignored``: the teardown signals that stay ignored when the caller ignores them
    (default: all of them; the launcher keeps only SIGHUP, for ``nohup``, so that a background
    job started with SIGINT ignored still stops on an explicit ``kill -INT``).
    ``on_failure(exit)`` is called from the loop once, when the first failure is observed and
    before the others are signalled (say, to take the other workers' stacks); it blocks the
    loop while it runs, so it must bound its own time.

    Callers extend the loop without threads: :meth:`call_every` (timers),
    :meth:`add_reader` (an fd of the caller's, such as a listening socket),
    :meth:`send_signal` (to workers only, not their trees) and :meth:`request_stop` (a
    teardown begun from a callback, recorded as ``RunResult.stop_reason``). Callbacks run in the
    thread that runs the loop, between events; an exception from one tears everything down and
    propagates from :meth:`wait` / :meth:`run`.

    Bad arguments raise :class:`UsageError`; nothing starts.
    """

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        grace_period: float = 30.0,
        teardown_signals: Sequence[int] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP),
        forward_signals: Sequence[int] = (),
        kill_wait: float = 5.0,
        is_failure: Callable[[WorkerExit], bool] | None = None,
        on_exit: Callable[[WorkerExit], None] | None = None,
        kill: Callable[[int, int], None] = os.kill,
        use_watchdog: bool = True,
        relay_signal: bool = False,
        keep_ignored: Sequence[int] | None = None,
        on_failure: Callable[[WorkerExit], None] | None = None,
    ) -> None:
        if not specs:
            raise UsageError("no workers to start; give at least one WorkerSpec")
        ranks = [spec.local_rank for spec in specs]
        if len(set(ranks)) != len(ranks):
            raise UsageError(f"local ranks must be unique, got {ranks}")
        if grace_period < 0 or kill_wait < 0:
            raise UsageError("grace_period and kill_wait must be >= 0 seconds")
        _check_signals(teardown_signals, forward_signals)
        self.grace_period = float(grace_period)
        self.kill_wait = float(kill_wait)
        self._specs = sorted(specs, key=lambda spec: spec.local_rank)
        self._teardown_signals = tuple(teardown_signals)
        self._forward_signals = tuple(forward_signals)
        self._is_failure = is_failure
        self._on_exit = on_exit
        self._on_failure = on_failure
        self._kill = kill
        self._want_watchdog = use_watchdog
        self._relay_signal = relay_signal
        self._keep_ignored = self._teardown_signals if keep_ignored is None else tuple(keep_ignored)
        self._stop_signal = signal.SIGTERM  # what a teardown sends first (see relay_signal)
        self.run_id = f"{os.getpid()}-{os.urandom(6).hex()}"
        self._marker = f"{RUN_ID_ENV}={self.run_id}".encode()
        self._phase = _NEW
        self._workers: list[_Worker] = []
        self._selector: selectors.BaseSelector | None = None
        self._wakeup_r: socket.socket | None = None
        self._wakeup_w: socket.socket | None = None
        self._watchdog: subprocess.Popen[bytes] | None = None
        self._watchdog_fd: int | None = None
        self._tracked: dict[int, int | None] = {}  # owned descendant pid -> pidfd
        self._seen_owned: set[int] = set()
        self._deadline = 0.0
        self._first_failure: _Worker | None = None
        self._received_signal: int | None = None
        self._result: RunResult | None = None
        self._fallback = False  # some worker has no pidfd (see the module docstring)
        self._sigchld = False  # while wait() holds a SIGCHLD handler for the fallback
        self._signalled_owned: dict[int, int] = {}  # owned pid -> last signal sent
        self._subreaper_held = False
        self._programs: dict[int, str] = {}
        self._consoles: list[Any] = []  # what tee'd sinks show on (see _watch_consoles)
        self._watched_consoles: set[int] = set()
        self._timers: list[_Timer] = []
        self._readers: dict[int, Callable[[], None]] = {}
        self._stop_reason: str | None = None

    # --- public --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every worker, back to back, bound at birth.

        Every spec is checked first (UsageError / BindingError, nothing started). If a worker
        still cannot start (exec or binding failure in the child), the workers already started
        are killed (SIGKILL to their trees, reaped) and UsageError or BindingError is raised.
        Raises RuntimeError when called twice.
        """
        if self._phase != _NEW:
            raise RuntimeError("Supervisor.start() may be called once; make a new Supervisor")
        self._programs = {spec.local_rank: _validate_spec(spec) for spec in self._specs}
        self._phase = _RUNNING
        for stream in (sys.stdout, sys.stderr):
            try:
                if stream is not None:
                    stream.flush()  # forked children would print the buffered text again
            except (OSError, ValueError):
                pass
        self._open_loop()
        _acquire_subreaper()
        self._subreaper_held = True
        try:
            # A teardown signal that arrives while workers start is noted here and acted on by
            # the next wait(); it neither kills us half-way nor gets lost.
            with self._signal_scope():
                for spec in self._specs:
                    self._workers.append(self._start_worker(spec))
                self._await_exec()
                self._deliver_payloads()
                if self._want_watchdog:
                    # Started last so that workers start sooner; until it runs, the workers'
                    # own parent-death signal covers a supervisor that dies (no grandchildren).
                    self._start_watchdog()
        except BaseException as exc:
            self._abort_start()
            raise _start_error(exc) from exc

    def run(self, on_started: Callable[[], None] | None = None) -> RunResult:
        """:meth:`start`, then :meth:`wait` until the run ends, under one signal scope.

        Unlike calling the two in turn, no signal can arrive between them while the caller's
        handlers are back in place. ``on_started`` is called once every worker has started
        (say, to import what a failure report needs while workers boot). Raises what
        :meth:`start` raises.
        """
        if self._phase != _NEW:
            raise RuntimeError("Supervisor.run() may be called once; make a new Supervisor")
        self._open_loop()
        with self._signal_scope():
            self.start()
            if on_started is not None:
                on_started()
            result = self.wait()
        assert result is not None
        return result

    def pids(self) -> list[int]:
        """The started workers' pids, by local rank (empty before :meth:`start`)."""
        return [worker.pid for worker in self._workers]

    def wait(self, timeout: float | None = None) -> RunResult | None:
        """Run the loop until the run ends; None if ``timeout`` seconds passed first
        (``wait(0)`` handles what is ready without waiting).

        The run ends when every worker succeeded (leftover owned processes are then torn down
        too), or after the teardown that follows the first failure, a teardown signal or
        :meth:`stop`. After it ended, returns the same RunResult again. If the loop itself raises
        (an output sink raising, say), every owned process is killed and the error propagates.
        """
        if self._result is not None:
            return self._result
        if self._phase in (_NEW, _DONE):
            raise RuntimeError("Supervisor.wait() needs a successful start()")
        deadline = None if timeout is None else time.monotonic() + timeout
        finished = False
        try:
            with self._signal_scope() as scope:
                self._sigchld = scope.sigchld
                finished = self._loop(deadline)
            self._sigchld = False
        except BaseException:
            self._emergency_stop()
            raise
        if not finished:
            return None
        return self._finish()

    def stop(self, grace_period: float | None = None) -> RunResult:
        """Tear down now (SIGTERM, SIGKILL after ``grace_period``, default the constructor's)
        and return the RunResult; returns the existing result if the run already ended."""
        if self._result is not None:
            return self._result
        if self._phase in (_NEW, _DONE):  # never started, or start() failed and cleaned up
            self._phase = _DONE
            self._result = RunResult([], None, None, [])
            return self._result
        if grace_period is not None:
            self.grace_period = float(grace_period)
        if self._phase == _RUNNING:
            self._begin_teardown()
        elif self._phase == _TERMINATING:  # already tearing down: the new grace may be shorter
            self._deadline = min(self._deadline, time.monotonic() + self.grace_period)
        result = self.wait()
        assert result is not None
        return result

    def __enter__(self) -> Supervisor:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._result is None and self._phase not in (_NEW, _DONE):
            self.stop()

    # --- extending the loop --------------------------------------------------------------------

    def call_every(self, interval: float, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from the loop every ``interval`` seconds (> 0), first after one
        interval, while the workers run (not during start or teardown). Call before or after
        :meth:`start`; there is no way to cancel a timer but ending the run."""
        if not interval > 0:
            raise UsageError(f"call_every needs an interval > 0 seconds, got {interval!r}")
        self._timers.append(_Timer(float(interval), callback, time.monotonic() + interval))

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from the loop whenever ``fd`` (the caller's; never closed here)
        is readable, until :meth:`remove_reader` or the end of the run."""
        if fd in self._readers:
            raise UsageError(f"fd {fd} already has a reader; remove it first")
        self._readers[fd] = callback
        if self._selector is not None:
            self._selector.register(fd, selectors.EVENT_READ, ("reader", callback))

    def remove_reader(self, fd: int) -> None:
        """Stop watching ``fd``; nothing happens when it is not watched."""
        if self._readers.pop(fd, None) is not None and self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(fd)

    def send_signal(self, signum: int, local_ranks: Sequence[int] | None = None) -> list[int]:
        """Send ``signum`` to each running worker process (not its process group or
        descendants), or to those of ``local_ranks``; returns the local ranks reached. A
        worker that has exited is never signalled, so a reused pid is never hit."""
        wanted = None if local_ranks is None else set(local_ranks)
        reached = []
        for worker in self._workers:
            rank = worker.spec.local_rank
            if worker.exited or worker.pid <= 0 or (wanted is not None and rank not in wanted):
                continue
            try:
                self._kill(worker.pid, signum)
            except ProcessLookupError:
                continue
            reached.append(rank)
        return reached

    def request_stop(self, reason: str) -> None:
        """Begin a teardown now (SIGTERM, SIGKILL after the grace period) without waiting;
        the run then ends as usual and ``RunResult.stop_reason`` is ``reason``. For callbacks
        running inside the loop; does nothing once a teardown has begun."""
        if self._phase == _RUNNING:
            self._stop_reason = reason
            self._begin_teardown()

    # --- starting ------------------------------------------------------------------------------

    def _open_loop(self) -> None:
        """The selector and the signal wakeup socket; idempotent (run() opens them early)."""
        if self._selector is not None:
            return
        self._selector = selectors.DefaultSelector()
        children.track(self._selector.fileno())
        self._wakeup_r, self._wakeup_w = socket.socketpair()
        for sock in (self._wakeup_r, self._wakeup_w):
            sock.setblocking(False)
            children.track(sock.fileno())
        self._selector.register(self._wakeup_r, selectors.EVENT_READ, ("signal", None))
        for fd, callback in self._readers.items():
            self._selector.register(fd, selectors.EVENT_READ, ("reader", callback))

    def _signal_scope(self) -> _SignalScope:
        return _SignalScope(
            self._wakeup_w,
            self._teardown_signals,
            self._forward_signals,
            self._fallback,
            keep_ignored=self._keep_ignored,
        )

    def _start_watchdog(self) -> None:
        env = {key: value for key, value in os.environ.items() if key != RUN_ID_ENV}
        self._watchdog = subprocess.Popen(
            watchdog.watchdog_argv(self.run_id),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            close_fds=True,
        )
        assert self._watchdog.stdin is not None
        self._watchdog_fd = children.track(self._watchdog.stdin.fileno())
        self._tell_watchdog(b"".join(b"%d\n" % worker.pid for worker in self._workers))

    def _tell_watchdog(self, message: bytes) -> None:
        if self._watchdog_fd is None:
            return
        # A dead watchdog only loses the last-resort cleanup.
        with contextlib.suppress(OSError):
            os.write(self._watchdog_fd, message)

    def _start_worker(self, spec: WorkerSpec) -> _Worker:
        worker = _Worker(spec)
        env = dict(spec.env)
        env[RUN_ID_ENV] = self.run_id
        child_fds: list[int] = []
        payload_child = result_child = -1
        streams: dict[str, int] = {}
        try:
            if spec.payload is not None:
                worker.payload_fd, payload_child = children.parent_pipe(parent_reads=False)
                children.enlarge_pipe(worker.payload_fd)
                worker.payload_view = memoryview(spec.payload).cast("B")
                child_fds.append(payload_child)
            if spec.want_result:
                worker.result_fd, result_child = children.parent_pipe(parent_reads=True)
                children.enlarge_pipe(worker.result_fd)
                child_fds.append(result_child)
            for name, sink in (("stdout", spec.stdout), ("stderr", spec.stderr)):
                if sink is not None:
                    parent_end, child_end = children.parent_pipe(parent_reads=True)
                    worker.outputs[parent_end] = sink
                    streams[name] = child_end
                    child_fds.append(child_end)
            if spec.start == "exec":
                if spec.payload is not None:
                    env[PAYLOAD_FD_ENV] = str(payload_child)
                if spec.want_result:
                    env[RESULT_FD_ENV] = str(result_child)
                self._exec_worker(worker, env, child_fds, streams)
            elif spec.start == "fork":
                self._fork_worker(worker, env, payload_child, result_child, streams)
            else:
                self._forkserver_worker(worker, env, payload_child, result_child, streams)
        except BaseException:
            for fd in (worker.payload_fd, worker.result_fd, *worker.outputs):
                children.close(fd)
            raise
        finally:
            for fd in child_fds:
                children.close(fd)
        self._register_worker(worker)
        return worker

    def _exec_worker(
        self, worker: _Worker, env: dict[str, str], pass_fds: list[int], streams: dict[str, int]
    ) -> None:
        spec = worker.spec
        program = self._programs[spec.local_rank]
        parent_pid = os.getpid()
        check_r, check_w = os.pipe()
        children.track(check_r)
        children.track(check_w)
        try:
            pid = children.fork()
            if pid == 0:
                children.exec_child(
                    check_w,
                    parent_pid,
                    spec,
                    program,
                    env,
                    [*(fd for fd in pass_fds if fd not in streams.values()), *spec.pass_fds],
                    streams.get("stdout"),
                    streams.get("stderr"),
                )
        except BaseException:
            children.close(check_r)
            raise
        finally:
            children.close(check_w)
        worker.pid = pid
        worker.exec_check_fd = check_r

    def _await_exec(self) -> None:
        """Wait until every exec worker exec'd (all at once, not one by one); raise the first
        error as UsageError (exec) or BindingError (binding), one line."""
        import select

        pending = {w.exec_check_fd: w for w in self._workers if w.exec_check_fd is not None}
        reports: dict[int, bytes] = {}
        deadline = time.monotonic() + _EXEC_LIMIT
        while pending:
            ready, _, _ = select.select(list(pending), [], [], deadline - time.monotonic())
            if not ready:
                rank = next(iter(pending.values())).spec.local_rank
                raise UsageError(
                    f"local rank {rank} did not reach exec within {_EXEC_LIMIT:.0f} s after "
                    "fork (a lock held by another thread at fork time?)"
                )
            for fd in ready:
                data = os.read(fd, 4096)
                if data:
                    reports[fd] = reports.get(fd, b"") + data
                    continue
                worker = pending.pop(fd)
                worker.exec_check_fd = None
                children.close(fd)
                if fd in reports:
                    raise _child_error(worker.spec, reports[fd].decode(errors="replace"))

    def _deliver_payloads(self) -> None:
        """Write every payload now, to all children at once, so that workers run whether or not
        anyone waits; what a child has not read within ``_EXEC_LIMIT`` stays with the loop.
        What the workers send meanwhile (results, output, the caller's readers) is read as the
        loop reads it, so a worker that answers while it reads cannot stall us; exits and
        signals wait for the loop."""
        assert self._selector is not None
        deadline = time.monotonic() + _EXEC_LIMIT
        while any(w.payload_fd is not None for w in self._workers):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for key, mask in self._selector.select(left):
                if key.data[0] in ("payload", "result", "output", "reader"):
                    self._dispatch(key, mask)

    def _fork_worker(
        self,
        worker: _Worker,
        env: dict[str, str],
        payload_fd: int,
        result_fd: int,
        streams: dict[str, int],
    ) -> None:
        spec = worker.spec
        parent_pid = os.getpid()
        keep = {fd for fd in (payload_fd, result_fd, *streams.values(), *spec.pass_fds) if fd >= 0}
        pid = children.fork()
        if pid == 0:
            children.fork_child(
                keep,
                parent_pid,
                worker.spec,
                env,
                payload_fd,
                result_fd,
                streams.get("stdout"),
                streams.get("stderr"),
                _SignalScope.restore_callers_handlers,
            )
        worker.pid = pid

    def _forkserver_worker(
        self,
        worker: _Worker,
        env: dict[str, str],
        payload_fd: int,
        result_fd: int,
        streams: dict[str, int],
    ) -> None:
        import multiprocessing
        import pickle
        from multiprocessing import forkserver

        spec = worker.spec
        context = multiprocessing.get_context("forkserver")
        forkserver.ensure_running()
        server_pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)

        def inherited(fd: int | None) -> children.InheritedFd | int | None:
            if fd is None:
                return None
            return -1 if fd < 0 else children.InheritedFd(fd)

        process = context.Process(
            target=children.forkserver_child,
            args=(
                spec.fork_target,
                server_pid,
                tuple(spec.cpus) if spec.cpus is not None else None,
                spec.mem,
                env,
                spec.cwd,
                inherited(payload_fd),
                inherited(result_fd),
                inherited(streams.get("stdout")),
                inherited(streams.get("stderr")),
                tuple(children.InheritedFd(fd) for fd in spec.pass_fds),
            ),
            name=f"numarun-rank{spec.local_rank}",
        )
        try:
            process.start()
        except (pickle.PicklingError, TypeError, AttributeError) as exc:
            # Lambdas and local functions: PicklingError or AttributeError; live objects
            # (locks, sockets) held by a partial: TypeError.
            raise UsageError(
                f"local rank {spec.local_rank}: start='forkserver' needs a picklable "
                f"module-level fork_target ({exc})"
            ) from exc
        # The supervisor waits for it and closes it: multiprocessing's exit handler must not
        # join it too (it would find it closed).
        _forget_child(process)
        worker.process = process
        worker.pid = process.pid

    def _register_worker(self, worker: _Worker) -> None:
        assert self._selector is not None
        if worker.process is not None:
            worker.exit_fd = worker.process.sentinel
        else:
            worker.exit_fd = _open_pidfd(worker.pid)
            worker.owns_exit_fd = worker.exit_fd is not None
            if worker.exit_fd is None:
                self._fallback = True
        if worker.exit_fd is not None:
            self._selector.register(worker.exit_fd, selectors.EVENT_READ, ("exit", worker))
        for fd, sink in worker.outputs.items():
            self._selector.register(fd, selectors.EVENT_READ, ("output", worker))
            console = getattr(sink, "console", None)
            if console is not None and all(console is not c for c in self._consoles):
                self._consoles.append(console)
        if worker.result_fd is not None:
            self._selector.register(worker.result_fd, selectors.EVENT_READ, ("result", worker))
        if worker.payload_fd is not None:
            self._selector.register(worker.payload_fd, selectors.EVENT_WRITE, ("payload", worker))

    def _abort_start(self) -> None:
        """A worker could not start: kill what started, release everything."""
        self._kill_everything()
        self._release()
        self._phase = _DONE

    # --- the loop ------------------------------------------------------------------------------

    def _loop(self, deadline: float | None) -> bool:
        """Dispatch events and advance phases until done (True) or ``deadline`` (False).
        Events already waiting are dispatched even when ``deadline`` has passed (``wait(0)``)."""
        assert self._selector is not None
        if self._fallback:
            self._poll_workers()  # deaths before our SIGCHLD handler existed
        passes = 0
        while True:
            self._advance()
            if self._phase == _DONE:
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline and passes:
                return False
            passes += 1
            timeouts = [
                t for t in (deadline, self._phase_deadline(), self._next_timer()) if t is not None
            ]
            timeout = max(0.0, min(timeouts) - now) if timeouts else None
            must_poll = (self._fallback and not self._sigchld) or not self._all_tracked_fds()
            if must_poll:
                timeout = _FALLBACK_TICK if timeout is None else min(timeout, _FALLBACK_TICK)
            self._watch_consoles()
            for key, mask in self._selector.select(timeout):
                self._dispatch(key, mask)
            if must_poll:
                self._poll_workers()
            self._run_due_timers()

    def _next_timer(self) -> float | None:
        if self._phase != _RUNNING or not self._timers:
            return None
        return min(timer.due for timer in self._timers)

    def _run_due_timers(self) -> None:
        now = time.monotonic()
        for timer in self._timers:
            if self._phase != _RUNNING:
                return
            if timer.due <= now:
                # The next call is one interval after this one ends: a slow callback never
                # makes calls pile up.
                timer.callback()
                timer.due = time.monotonic() + timer.interval

    def _phase_deadline(self) -> float | None:
        return self._deadline if self._phase in (_TERMINATING, _KILLING, _DRAINING) else None

    def _all_tracked_fds(self) -> bool:
        return all(fd is not None for fd in self._tracked.values())

    def _dispatch(self, key: selectors.SelectorKey, mask: int) -> None:
        assert self._selector is not None
        if self._selector.get_map().get(key.fd) is not key:
            return  # unregistered by an earlier event of the same batch (its fd may be reused)
        kind, worker = key.data
        if kind == "exit":
            self._check_exit(worker)
        elif kind == "output":
            self._read_output(worker, key.fd)
        elif kind == "result":
            self._read_result(worker)
        elif kind == "payload":
            self._write_payload(worker)
        elif kind == "owned":
            self._untrack(worker)
        elif kind == "console":
            self._flush_console(worker)
        elif kind == "reader":
            worker()
        else:
            self._read_signals()

    def _poll_workers(self) -> None:
        for worker in self._workers:
            if not worker.exited:
                self._check_exit(worker)
        for pid, fd in list(self._tracked.items()):
            if fd is None and not watchdog.is_alive(watchdog.read_proc_stat(pid)):
                self._untrack(pid)

    def _advance(self) -> None:
        """Phase transitions; called after every batch of events."""
        now = time.monotonic()
        all_exited = all(worker.exited for worker in self._workers)
        if self._phase == _RUNNING and all_exited:
            self._begin_teardown()  # success: leftovers (daemonized grandchildren) go too
        if self._phase in (_TERMINATING, _KILLING):
            if all_exited and not self._tracked:
                signum = self._stop_signal if self._phase == _TERMINATING else signal.SIGKILL
                if not self._signal_owned(signum):
                    self._begin_draining()
            elif now >= self._deadline:
                if self._phase == _TERMINATING:
                    self._escalate()
                else:
                    self._give_up_on_survivors()
                    self._begin_draining()
        if self._phase == _DRAINING and (
            not (self._open_streams() or any(c.pending() for c in self._consoles))
            or now >= self._deadline
        ):
            self._phase = _DONE

    def _open_streams(self) -> bool:
        return any(worker.outputs for worker in self._workers)

    def _watch_consoles(self, *, watch: bool = True) -> None:
        """Wait for a console (:class:`numarun.logs.Console`) to be writable only while
        output waits for it: tee'd lines are queued there, never written blocking, so a
        stalled terminal or pipe cannot stop this loop from handling signals and deaths."""
        assert self._selector is not None
        for console in self._consoles:
            fd = console.fileno()
            if watch and console.pending():
                if fd not in self._watched_consoles:
                    self._selector.register(fd, selectors.EVENT_WRITE, ("console", console))
                    self._watched_consoles.add(fd)
            elif fd in self._watched_consoles:
                self._selector.unregister(fd)
                self._watched_consoles.discard(fd)

    def _flush_console(self, console: Any) -> None:
        if console.flush() and self._phase == _DRAINING:
            # The reader is alive, only slow: give it time, as long as it makes progress.
            self._deadline = max(self._deadline, time.monotonic() + self.kill_wait)

    def _begin_teardown(self, received: int | None = None) -> None:
        self._phase = _TERMINATING
        self._deadline = time.monotonic() + self.grace_period
        if received is not None and self._relay_signal:
            self._stop_signal = received
        # The process table is read before any signal: parent links to a worker are lost as
        # soon as it dies, and its new-session children would then look like strangers.
        owned = self._sweep()
        groups = self._signal_workers(self._stop_signal)
        self._signal_owned(self._stop_signal, owned, signalled_groups=groups)

    def _escalate(self) -> None:
        self._phase = _KILLING
        self._deadline = time.monotonic() + self.kill_wait
        owned = self._sweep()
        self._signal_workers(signal.SIGKILL)
        self._signal_owned(signal.SIGKILL, owned)

    def _begin_draining(self) -> None:
        self._reap_owned_zombies()
        self._phase = _DRAINING
        self._deadline = time.monotonic() + self.kill_wait
        for worker in self._workers:
            if worker.state == UNKILLABLE:
                # Its pipes may never reach end of file: stop reading them now.
                for fd in list(worker.outputs):
                    self._close_output(worker, fd)

    def _signal_workers(self, signum: int) -> set[int]:
        """Send ``signum`` to each live worker's process group; returns the groups reached."""
        groups: set[int] = set()
        for worker in self._workers:
            if worker.exited or worker.state == UNKILLABLE:
                continue
            worker.signalled = True
            try:
                self._kill(-worker.pid, signum)
                groups.add(worker.pid)
            except ProcessLookupError:
                # Not yet a group leader (a fork child before setsid) or already gone.
                with contextlib.suppress(ProcessLookupError):
                    self._kill(worker.pid, signum)
        return groups

    def _sweep(self) -> dict[int, watchdog.ProcInfo]:
        """The workers' live or zombie descendants now (workers themselves left out):
        pid -> (ppid, pgid, sid, state), from one read of /proc."""
        table = watchdog.read_proc_table()
        me = os.getpid()
        exclude = watchdog.ancestors(me, table) | {me}
        if self._watchdog is not None:
            exclude.add(self._watchdog.pid)
        worker_pids = {worker.pid for worker in self._workers}
        # Workers are signalled and watched by _signal_workers; here only their descendants.
        owned = (
            watchdog.find_run_processes(
                table,
                roots={worker.pid for worker in self._workers if not worker.exited},
                sessions=worker_pids,
                marker=self._marker,
                exclude=exclude,
            )
            - worker_pids
        )
        self._seen_owned |= owned
        return {pid: table[pid] for pid in owned}

    def _signal_owned(
        self,
        signum: int,
        owned: dict[int, watchdog.ProcInfo] | None = None,
        signalled_groups: set[int] = frozenset(),
    ) -> bool:
        """Send ``signum`` to every live process of ``owned`` (default: a fresh sweep) that has
        not had it yet (members of ``signalled_groups`` just had it through their group) and
        track them until they are gone. True if any was found alive."""
        if owned is None:
            owned = self._sweep()
        found = False
        for pid, info in owned.items():
            if not watchdog.is_alive(info):
                continue
            found = True
            if self._signalled_owned.get(pid) != signum and info[1] not in signalled_groups:
                try:
                    self._kill(pid, signum)
                except ProcessLookupError:
                    continue
            self._signalled_owned[pid] = signum
            if pid not in self._tracked:
                self._track_owned(pid)
        return found

    def _track_owned(self, pid: int) -> None:
        assert self._selector is not None
        try:
            fd = _open_pidfd(pid)
        except ProcessLookupError:
            return
        self._tracked[pid] = fd
        if fd is not None:
            self._selector.register(fd, selectors.EVENT_READ, ("owned", pid))

    def _untrack(self, pid: int) -> None:
        fd = self._tracked.pop(pid, None)
        if fd is not None and self._selector is not None:
            self._selector.unregister(fd)
            children.close(fd)

    def _give_up_on_survivors(self) -> None:
        for worker in self._workers:
            if not worker.exited:
                info = watchdog.read_proc_stat(worker.pid)
                worker.state = UNKILLABLE
                worker.proc_state = info[3] if info is not None else None
                self._unregister_exit_fd(worker)
                self._close_pipes_of_dead(worker)
        for pid in list(self._tracked):
            self._untrack(pid)

    def _reap_owned_zombies(self) -> None:
        """waitpid() the owned processes that were reparented to us and have exited."""
        me = os.getpid()
        for pid in list(self._seen_owned):
            info = watchdog.read_proc_stat(pid)
            if info is None or info[0] != me or info[3] not in "ZX":
                continue
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            self._seen_owned.discard(pid)

    # --- events --------------------------------------------------------------------------------

    def _check_exit(self, worker: _Worker) -> None:
        code = worker.poll()
        if code is None:
            return
        worker.exited = True
        worker.exit_code = code
        worker.ended_at = time.time()
        self._unregister_exit_fd(worker)
        if worker.result_fd is not None:
            self._read_result(worker, until_empty=True)
        self._close_pipes_of_dead(worker)
        state = self._state_of(worker)
        worker.state = state
        ended = self._exit_of(worker)
        if state == FAILED and self._first_failure is None:
            self._first_failure = worker
            if self._phase == _RUNNING:
                if self._on_failure is not None:
                    self._on_failure(ended)
                self._begin_teardown()
        if self._on_exit is not None:
            self._on_exit(ended)

    def _state_of(self, worker: _Worker) -> str:
        code = worker.exit_code
        assert code is not None
        if worker.signalled and (code <= 0 or code >= 128):
            return TERMINATED
        if code != 0:
            return FAILED
        if self._is_failure is not None and self._is_failure(
            self._exit_of(worker, state=SUCCEEDED)
        ):
            return FAILED
        return SUCCEEDED

    def _exit_of(self, worker: _Worker, state: str | None = None) -> WorkerExit:
        state = state or worker.state or UNKILLABLE
        ended = WorkerExit(
            local_rank=worker.spec.local_rank,
            rank=worker.spec.rank,
            pid=worker.pid,
            exit_code=worker.exit_code if state != UNKILLABLE else None,
            signal_name=signal_name(worker.exit_code) if state != UNKILLABLE else None,
            state=state,
            ended_at=worker.ended_at if state != UNKILLABLE else None,
            result=bytes(worker.result),
            proc_state=worker.proc_state if state == UNKILLABLE else None,
        )
        return ended

    def _unregister_exit_fd(self, worker: _Worker) -> None:
        if worker.exit_fd is None:
            return
        assert self._selector is not None
        self._selector.unregister(worker.exit_fd)
        if worker.owns_exit_fd:
            children.close(worker.exit_fd)
        worker.exit_fd = None

    def _close_pipes_of_dead(self, worker: _Worker) -> None:
        """A dead worker reads no payload and writes no result; its output may go on (a
        grandchild holding the pipe), so output pipes stay until end of file."""
        assert self._selector is not None
        if worker.payload_fd is not None:
            self._selector.unregister(worker.payload_fd)
            children.close(worker.payload_fd)
            worker.payload_fd = None
            worker.payload_view = None
        if worker.result_fd is not None:
            self._selector.unregister(worker.result_fd)
            children.close(worker.result_fd)
            worker.result_fd = None

    def _read_output(self, worker: _Worker, fd: int) -> None:
        try:
            data = os.read(fd, _READ_SIZE)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if data:
            worker.outputs[fd].feed(data)
        else:
            self._close_output(worker, fd)

    def _close_output(self, worker: _Worker, fd: int) -> None:
        sink = worker.outputs.pop(fd)
        if self._selector is not None:
            self._selector.unregister(fd)
        children.close(fd)
        sink.close()

    def _read_result(self, worker: _Worker, *, until_empty: bool = False) -> None:
        assert worker.result_fd is not None and self._selector is not None
        while True:
            try:
                data = os.read(worker.result_fd, _READ_SIZE)
            except BlockingIOError:
                return
            if not data:
                self._selector.unregister(worker.result_fd)
                children.close(worker.result_fd)
                worker.result_fd = None
                return
            worker.result += data
            if not until_empty:
                return

    def _write_payload(self, worker: _Worker) -> None:
        assert worker.payload_fd is not None and worker.payload_view is not None
        try:
            written = os.write(worker.payload_fd, worker.payload_view[: children.PIPE_SIZE])
        except BlockingIOError:
            return
        except OSError:
            written = len(worker.payload_view)  # the reader is gone; drop the rest
        worker.payload_view = worker.payload_view[written:]
        if not worker.payload_view:
            assert self._selector is not None
            self._selector.unregister(worker.payload_fd)
            children.close(worker.payload_fd)
            worker.payload_fd = None
            worker.payload_view = None

    def _read_signals(self) -> None:
        assert self._wakeup_r is not None
        try:
            data = self._wakeup_r.recv(4096)
        except BlockingIOError:
            return
        for signum in data:
            if signum in self._teardown_signals:
                if self._phase == _RUNNING:
                    self._received_signal = signum
                    self._begin_teardown(signum)
                elif self._phase == _TERMINATING:
                    self._escalate()  # asked twice: skip the rest of the grace period
            elif signum in self._forward_signals:
                self.send_signal(signum)
            elif signum == signal.SIGCHLD:
                self._poll_workers()

    # --- the end -------------------------------------------------------------------------------

    def _finish(self) -> RunResult:
        for worker in self._workers:
            for fd in list(worker.outputs):
                self._close_output(worker, fd)
        for console in self._consoles:
            console.flush()
            if console.pending():
                console.abandon()  # the reader stalled for kill_wait: the run must end
        exits = [self._exit_of(worker) for worker in self._workers]
        first = None
        if self._first_failure is not None:
            first = exits[self._workers.index(self._first_failure)]
        self._result = RunResult(
            workers=exits,
            first_failure=first,
            received_signal=self._received_signal,
            unkillable=[ended for ended in exits if ended.state == UNKILLABLE],
            stop_reason=self._stop_reason,
        )
        self._release()
        self._phase = _DONE
        return self._result

    def _kill_everything(self) -> None:
        """SIGKILL every worker tree and owned process now; reap; bounded by ``kill_wait``."""
        self._phase = _KILLING
        self._deadline = time.monotonic() + self.kill_wait
        owned = self._sweep()
        self._signal_workers(signal.SIGKILL)
        self._signal_owned(signal.SIGKILL, owned)
        selector = self._selector
        if selector is not None:
            self._watch_consoles(watch=False)  # this loop only reaps; consoles wait
        while selector is not None and time.monotonic() < self._deadline:
            pending = [w for w in self._workers if not w.exited]
            if not pending and not self._tracked:
                break
            timeout = max(0.0, self._deadline - time.monotonic())
            if not self._all_tracked_fds() or any(w.exit_fd is None for w in pending):
                timeout = min(timeout, _FALLBACK_TICK)
            for key, _mask in selector.select(timeout):
                if selector.get_map().get(key.fd) is not key:
                    continue
                kind, item = key.data
                if kind == "exit":
                    self._check_exit(item)
                elif kind == "owned":
                    self._untrack(item)
                elif kind == "output":
                    self._read_output(item, key.fd)
            self._poll_workers()
            if all(w.exited for w in self._workers) and not self._tracked:
                self._signal_owned(signal.SIGKILL)
        self._give_up_on_survivors()
        self._reap_owned_zombies()

    def _emergency_stop(self) -> None:
        if self._result is not None or self._phase == _DONE:
            return
        try:
            self._kill_everything()
        finally:
            try:
                self._finish()
            except BaseException:
                self._release()
                self._phase = _DONE

    def _release(self) -> None:
        """Close every fd, end the watchdog, restore the subreaper flag. Idempotent."""
        for worker in self._workers:
            self._unregister_exit_fd(worker)
            if self._selector is not None:
                self._close_pipes_of_dead(worker)
            for fd in list(worker.outputs):
                self._close_output(worker, fd)
            if worker.process is not None:
                _forget_process(worker)
        for pid in list(self._tracked):
            self._untrack(pid)
        for worker in self._workers:
            children.close(worker.exec_check_fd)
            worker.exec_check_fd = None
        self._end_watchdog()
        if self._selector is not None:
            self._watch_consoles(watch=False)
            for fd in list(self._readers):
                self.remove_reader(fd)
            children.close_untracked(self._selector.fileno())
            self._selector.close()
            self._selector = None
        for sock in (self._wakeup_r, self._wakeup_w):
            if sock is not None:
                children.close_untracked(sock.fileno())
                sock.close()
        self._wakeup_r = self._wakeup_w = None
        if self._subreaper_held:
            self._subreaper_held = False
            _release_subreaper()

    def _end_watchdog(self) -> None:
        process = self._watchdog
        if process is None:
            return
        self._watchdog = None
        # Everything it could kill is gone or unkillable by now; no need to wait for its
        # interpreter to start and read "done".
        with contextlib.suppress(OSError):
            process.kill()
        if self._watchdog_fd is not None:
            children.close_untracked(self._watchdog_fd)
            self._watchdog_fd = None
        assert process.stdin is not None
        with contextlib.suppress(OSError):
            process.stdin.close()
        _wait_bounded(process, _WATCHDOG_WAIT)


@dataclass
class _Timer:
    """One :meth:`Supervisor.call_every` registration; ``due`` is a ``time.monotonic()``."""

    interval: float
    callback: Callable[[], None]
    due: float


def _forget_process(worker: _Worker) -> None:
    """Release a forkserver worker's Process; an unkillable one is dropped from
    multiprocessing's list of children, whose exit handler would otherwise join it forever."""
    process, worker.process = worker.process, None
    if worker.exited:
        process.close()
        return
    _forget_child(process)


def _forget_child(process: Any) -> None:
    """Drop ``process`` from multiprocessing's list of children, which its exit handler joins."""
    try:
        from multiprocessing import process as mp_process

        mp_process._children.discard(process)
    except (ImportError, AttributeError):
        pass


def _wait_bounded(process: subprocess.Popen[bytes], limit: float) -> None:
    """Reap ``process`` within ``limit`` seconds, SIGKILLing it if it takes longer."""
    import select

    try:
        pidfd = os.pidfd_open(process.pid) if _pidfd_available else None
    except OSError:
        pidfd = None
    try:
        if pidfd is not None:
            select.select([pidfd], [], [], limit)
            if process.poll() is None:
                process.kill()
            process.wait()
        else:
            try:
                process.wait(limit)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    finally:
        if pidfd is not None:
            os.close(pidfd)


class _SignalScope:
    """Installs the supervisor's signal handling in the main thread (elsewhere it does nothing)
    and restores the previous handlers and wakeup fd on exit. Scopes nest: an inner one
    restores the outer one's handlers. A teardown signal the caller ignores stays ignored when
    it is in ``keep_ignored`` (default: every teardown signal); the others are handled anyway,
    and exec'd workers then start with their default action, not the caller's SIG_IGN."""

    def __init__(
        self,
        wakeup: socket.socket | None,
        teardown: Sequence[int],
        forward: Sequence[int],
        fallback: bool,
        keep_ignored: Sequence[int] | None = None,
    ) -> None:
        self._wakeup = wakeup
        self._keep_ignored = tuple(teardown if keep_ignored is None else keep_ignored)
        self._signals = [*teardown, *forward]
        self._fallback = fallback
        self.sigchld = False
        self._previous: dict[int, Any] = {}
        self._previous_wakeup: int | None = None

    _active: ClassVar[list[_SignalScope]] = []  # the scopes now entered, outermost first

    @classmethod
    def restore_callers_handlers(cls) -> None:
        """In a forked worker: put back the handlers the caller had before any scope."""
        callers: dict[int, Any] = {}
        for scope in reversed(cls._active):  # outer scopes know the caller's own handlers
            callers.update(scope._previous)
        for signum, handler in callers.items():
            signal.signal(signum, handler)

    def __enter__(self) -> _SignalScope:
        if self._wakeup is None or threading.current_thread() is not threading.main_thread():
            return self
        _SignalScope._active.append(self)
        signals = list(self._signals)
        if self._fallback:
            signals.append(signal.SIGCHLD)  # the no-pidfd fallback: SIGCHLD wakes the loop
        self._previous_wakeup = signal.set_wakeup_fd(
            self._wakeup.fileno(), warn_on_full_buffer=False
        )
        for signum in signals:
            previous = signal.getsignal(signum)
            if previous is None:
                continue  # installed outside Python: we could not restore it exactly
            if previous == signal.SIG_IGN and signum in self._keep_ignored:
                continue  # ignored by the caller (SIGHUP under nohup): the job must survive it
            self._previous[signum] = previous
            signal.signal(signum, _note_signal)
        self.sigchld = signal.SIGCHLD in self._previous
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self in _SignalScope._active:
            _SignalScope._active.remove(self)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._previous_wakeup is not None:
            signal.set_wakeup_fd(self._previous_wakeup)


def _note_signal(signum: int, frame: object) -> None:
    """Python-level handler: the C handler already wrote ``signum`` to the wakeup fd."""


def _start_error(exc: BaseException) -> BaseException:
    """The one-line error for a worker that could not start."""
    if isinstance(exc, OSError) and not isinstance(exc, (UsageError, BindingError)):
        return UsageError(f"cannot start a worker: {exc.strerror or exc}")
    return exc


def _child_error(spec: WorkerSpec, report: str) -> BaseException:
    """The one-line error for a child's ``stage:errno:message`` report."""
    stage, _, rest = report.partition(":")
    _code, _, detail = rest.partition(":")
    who = f"local rank {spec.local_rank}"
    if stage == "bind":
        return BindingError(
            f"{who}: binding failed in the child ({detail}); check the CPU list and memory "
            "policy with `numarun plan`"
        )
    if stage == "exec":
        return UsageError(f"{who}: cannot start {spec.argv[0] if spec.argv else '?'}: {detail}")
    return UsageError(f"{who}: could not prepare the worker process ({detail})")
