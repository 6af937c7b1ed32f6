"""Start workers bound at birth, watch them without polling, and tear whole process trees down.

Every way numarun starts workers (the launcher's argv workers, :func:`numarun.spawn`) goes
through one :class:`Supervisor`. A worker is described by a :class:`WorkerSpec` and started one
of three ways (``WorkerSpec.start``):

* ``"exec"``: fork, then ``execve`` of ``argv``. ``argv[0]`` is looked up on the ``PATH`` of
  the worker's environment before anything starts. All workers are forked back to back (by the
  watchdog, below), then :meth:`Supervisor.start` waits for all their execs at once (a
  close-on-exec pipe each); an exec or binding error in a child is raised from ``start``.
* ``"fork"``: ``os.fork()`` (of the watchdog, itself a fork of this process taken in
  :meth:`Supervisor.start`: the same memory), then ``fork_target(payload_fd, result_fd)`` in the
  child; its return value is the exit status. ``os.environ`` is replaced by the spec's
  environment in the child only.
* ``"forkserver"``: :mod:`multiprocessing`'s forkserver forks the child, so inherited affinity
  cannot work; ``fork_target`` must be a picklable module-level function. Its stdout/stderr
  without a sink are the forkserver's (the supervisor's fds 1 and 2 when the forkserver
  started).

What each child runs before ``execve`` or ``fork_target`` and in what order (``setsid()``,
``PR_SET_PDEATHSIG(SIGKILL)``, a check that its parent is still the watchdog or the forkserver,
binding, stdio, closing fds, ``chdir``, ...), and how ``fork_target``'s outcome becomes the exit
status, is :mod:`numarun.process.forkexec`; so is the registry of the fds supervisors hold,
which forked children close. How a start proceeds, step by step, is
:mod:`numarun.process.starting`.

Workers run with ``NUMARUN_RUN_ID=<run id>`` added to their environment. ``payload`` is written
by the supervisor to a pipe (exec: fd number in ``NUMARUN_PAYLOAD_FD``; fork/forkserver:
``payload_fd``, -1 when there is no payload), then closed so the child sees end of file; it is
written during :meth:`Supervisor.start`, to all workers at once, so workers run as soon as
``start`` returns, joined or not (what a child has not read within a minute is left to the
loop). ``pass_fds``: fds of the caller's that the worker gets too (exec: open at the same
numbers; fork: kept open; forkserver: handed over by the forkserver), listed for the child in
:data:`numarun.process.forkexec.passed_fds` (fork/forkserver); the caller keeps and closes its own.
``want_result`` gives the child a pipe (exec: ``NUMARUN_RESULT_FD``; fork/forkserver:
``result_fd``, else -1) whose bytes, up to the worker's death, become ``WorkerExit.result``.

The watchdog (:mod:`numarun.process.watchdog`): :meth:`Supervisor.start` forks it first, a copy
of this process, and it forks the ``"exec"`` and ``"fork"`` workers, so that they and everything
they ever start stay below it (it is a child subreaper); it reports each worker's pid, exec and exit
to the supervisor over a pipe, keeps ended workers unreaped until the supervisor has read every
worker's end (``done``), reaps the rest, and kills the whole run if the supervisor dies, even by
SIGKILL. The supervisor pins the watchdog with a pidfd (a caller that ignores SIGCHLD has the
kernel reap it) and reaps it when the run ends, waiting at most two seconds, SIGKILL, two more.
Right after forking the watchdog, before waiting for it, :meth:`Supervisor.start` calls the
supervisor's ``on_forked()`` once: what the workers will want early can be made there while the
watchdog forks them and they start (the launcher compiles their script for them). It must bound
its own time; what it raises propagates from ``start`` as any failed start's error does, the
workers already forked killed.

Watching is one epoll loop (:mod:`numarun.process.loop`) over the watchdog's status pipe,
each ``"forkserver"`` worker's :class:`multiprocessing.Process` sentinel, the workers' output,
payload and result pipes, the pidfd of each process being torn down, the console while tee'd output
waits for it (a sink's ``console``, :class:`numarun.process.console.Console`: nothing in the loop
ever blocks on a slow terminal) and, in the main thread, a socket that ``signal.set_wakeup_fd``
writes to; timers are the select timeout. Where pidfds do not work (Linux before 5.3), processes
being torn down are checked every 50 ms. It never calls ``waitpid`` on a worker.

Ownership: a process is the run's when it descends from the watchdog (parent links in
``/proc``): exactly the workers and every process they started, however it detached. For
``"forkserver"`` workers (children of multiprocessing's fork server, not of the watchdog) also
their descendants while they live, processes in their sessions while they hold their pid, and
processes of the supervisor's real uid, started since the run, whose ``/proc/<pid>/environ``
holds this run's ``NUMARUN_RUN_ID`` (one in uninterruptible sleep is never read: the read could
block behind it). A process is pinned (a pidfd opened) before it is checked, and signalled
through the pidfd, so that a pid reused by another process is never signalled; the exec and fork
workers' pids, process groups and session ids cannot be reused before the supervisor has read
their ends (the watchdog keeps ended workers as zombies until then), a forkserver worker is
signalled only through the pidfd opened while it was proven to be the fork server's new child
(one that ended before, is never signalled), and a worker that ended is never signalled again.

Teardown sends SIGTERM (or, with ``relay_signal``, the teardown signal received) to each live
worker's process group and every owned process, then SIGCONT to the same, so that a stopped
process (SIGSTOP, Ctrl-Z) acts on it at once rather than at SIGKILL time; it waits until all are
gone or ``grace_period`` passed, then sends SIGKILL to all owned processes and sweeps again until
none is left, waiting at most ``kill_wait`` seconds. A worker still alive then (uninterruptible
sleep) is reported as ``"unkillable"`` with its ``/proc`` state letter and the call returns
anyway. After a successful run, owned leftovers (daemonized grandchildren) are torn down the
same way. The supervisor is never a child subreaper and reaps no process but the watchdog, so
its caller's own children and their orphans are never touched. Limit: with ``"forkserver"``
workers, a descendant that left the worker's session, never exec'd with the marker and lost its
parent chain to a live worker cannot be found. Each step (sweeping, pinning, signalling, giving
up): :mod:`numarun.process.teardown`.

If the supervisor dies, even by SIGKILL, the watchdog kills every process of the run (see
:mod:`numarun.process.watchdog`); if the watchdog dies, the workers get SIGKILL from the kernel
(``PR_SET_PDEATHSIG``).

Signals, only in the main thread, while :meth:`Supervisor.start`, :meth:`Supervisor.wait` or
:meth:`Supervisor.run` (both under one scope, so nothing falls between them) runs:
``teardown_signals`` make it tear down and return with ``RunResult.received_signal`` set (a
second one skips the rest of the grace period; one that arrives during ``start`` stops the start
where it is, so that workers not started yet never are (pid 0, state ``"not started"``), and is
acted on by the next ``wait``); ``forward_signals`` are sent to every live worker and the run
goes on. The
previous handlers and wakeup fd are restored when each call returns. Left alone: a teardown
signal the caller ignores, when it is in ``keep_ignored`` (SIGHUP under ``nohup``: the job
survives the hangup), and a signal whose handler was not installed from Python
(``signal.getsignal`` is None); how handlers are installed and restored is
:mod:`numarun.process.signals`. With ``relay_signal`` a signal-caused teardown sends the
received signal first (SIGINT reaches the workers as SIGINT), SIGKILL after the grace period.

The caller's CPU affinity, memory policy, environment and signal handlers are never changed;
no files are created (``"forkserver"`` starts :mod:`multiprocessing`'s forkserver once per
process, with its socket in a temporary directory that multiprocessing removes at exit); every
fd opened is closed when the run ends.

Inside, :class:`Supervisor` is a facade over its parts, and the run's phases. The parts: the loop
(:mod:`numarun.process.loop`), the signal scope (:mod:`numarun.process.signals`), the start
(:mod:`numarun.process.starting`), the workers' pipes (:mod:`numarun.process.streams`), the steps of
a teardown (:mod:`numarun.process.teardown`), the supervisor's end of the watchdog
(:class:`numarun.process.watchdog.Link`) and each worker's record (:mod:`numarun.process.record`);
they call back into the supervisor only through the callbacks it hands them. The phases, advanced
after every batch of events: *new*; *running* from :meth:`Supervisor.start`; *terminating* at the
first failure, a teardown signal, :meth:`Supervisor.stop`, :meth:`Supervisor.request_stop`, or once
every worker has ended (success: leftovers are swept); *killing* once the grace period passed or a
second teardown signal came; *draining* once every worker and owned process is gone (a fresh sweep
finds none) or, ``kill_wait`` after SIGKILL, the survivors were given up on: output is read until
end of file, for at most ``kill_wait`` seconds, longer while a slow console takes what waits for it;
*done*, with the RunResult. A start that fails, and a loop that raises, go straight to killing
everything and done.
"""

from __future__ import annotations

import _signal as signal  # not signal.py, whose enums cost a launch ~2 ms (DESIGN.md)
import os
import time

from numarun.process import watchdog
from numarun.process.loop import Loop
from numarun.process.proctable import FALLBACK_TICK
from numarun.process.signals import SignalScope
from numarun.process.spec import (
    FAILED,
    RUN_ID_ENV,
    SUCCEEDED,
    TERMINATED,
    UNKILLABLE,
    RunResult,
)
from numarun.process.starting import (
    Starter,
    check_arguments,
    flush_stdio,
    release_worker,
    start_error,
)
from numarun.process.streams import Streams
from numarun.process.teardown import Teardown

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from numarun.process.record import Worker
    from numarun.process.spec import WorkerExit, WorkerSpec


_NEW, _RUNNING, _TERMINATING, _KILLING, _DRAINING, _DONE = range(6)
_DEADLINED = (_TERMINATING, _KILLING, _DRAINING)  # the phases that end at self._deadline


class Supervisor:
    """Starts the workers of ``specs``, watches them, and tears them down (module docstring).

    ``grace_period``: seconds between SIGTERM and SIGKILL in a teardown (may be changed
    before :meth:`wait`/:meth:`stop`). ``kill_wait``: seconds to wait after SIGKILL before a
    survivor is reported unkillable. ``is_failure(exit)``: also count a worker that exited 0
    as failed (the spawn API: a callable that reported an exception). ``on_exit(exit)`` is called
    from the loop as each worker's end is observed. ``kill(pid, signum)`` sends the signals to
    workers and their process groups (a negative pid is a process group, as for ``os.kill``);
    with the default ``os.kill`` other processes are signalled through pidfds, a replacement
    (tests) sends every signal. ``use_watchdog``: the watchdog kills the run if the supervisor
    dies (it is started anyway: it is the workers' parent). ``remove_if_killed``: a directory
    the watchdog removes after killing the run, if the supervisor dies (the launcher's
    temporary directory when it holds nothing but the workers' error files).
    ``relay_signal``: a teardown caused by a teardown signal sends that signal first (SIGINT
    after Ctrl-C, so that workers' ``except KeyboardInterrupt`` runs, as under torchrun);
    otherwise, and after a failure or :meth:`stop`, the first signal is SIGTERM.
    ``keep_ignored``: the teardown signals that stay ignored when the caller ignores them
    (default: all of them; the launcher keeps only SIGHUP, for ``nohup``, so that a background
    job started with SIGINT ignored still stops on an explicit ``kill -INT``).
    ``on_failure(exit)`` is called from the loop once, when the first failure is observed and
    before the others are signalled (say, to take the other workers' stacks); it blocks the
    loop while it runs, so it must bound its own time. ``on_forked()``: module docstring.

    Callers extend the loop without threads: :meth:`call_every` (timers), :meth:`call_later`,
    :meth:`add_reader` / :meth:`add_writer` (an fd of the caller's, such as a listening socket,
    or a pipe a helper thread writes to), :meth:`send_signal` (to workers only, not their
    trees) and :meth:`request_stop` (a teardown begun from a callback, recorded as
    ``RunResult.stop_reason``). Callbacks run in the thread that runs the loop, between events;
    an exception from one tears everything down and propagates from :meth:`wait` / :meth:`run`.

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
        remove_if_killed: str | None = None,
        on_forked: Callable[[], None] | None = None,
    ) -> None:
        check_arguments(specs, grace_period, kill_wait, teardown_signals, forward_signals)
        self.grace_period = float(grace_period)
        self.kill_wait = float(kill_wait)
        self._specs = sorted(specs, key=lambda spec: spec.local_rank)
        self._teardown_signals = tuple(teardown_signals)
        self._forward_signals = tuple(forward_signals)
        self._is_failure = is_failure
        self._on_exit = on_exit
        self._on_failure = on_failure
        self._on_forked = on_forked
        self._kill_on_death = use_watchdog
        self._remove_if_killed = remove_if_killed
        self._relay_signal = relay_signal
        self._keep_ignored = self._teardown_signals if keep_ignored is None else tuple(keep_ignored)
        self._stop_signal = signal.SIGTERM  # what a teardown sends first (see relay_signal)
        self.run_id = f"{os.getpid()}-{os.urandom(6).hex()}"
        self._phase = _NEW
        self._workers: list[Worker] = []
        self._loop = Loop(self._on_signal)
        self._link = watchdog.Link()
        self._streams = Streams(self._loop, self._workers, self._console_progress)
        self._teardown = Teardown(
            self._loop,
            self._workers,
            self._link,
            kill=kill,
            forkserver=any(spec.start == "forkserver" for spec in self._specs),
            marker=f"{RUN_ID_ENV}={self.run_id}".encode(),
            on_given_up=self._stop_watching,
        )
        self._deadline = 0.0
        self._first_failure: Worker | None = None
        self._received_signal: int | None = None
        self._result: RunResult | None = None
        self._stop_reason: str | None = None
        self._held_scope: SignalScope | None = None  # see start(hold_signals=True)
        self._early_signals: list[int] = []  # read while the workers started
        self._holding_failure = self._failure_waits = False  # wait(hold_failure=True)

    # --- public --------------------------------------------------------------------------------

    def start(self, *, hold_signals: bool = False) -> None:
        """Start every worker, back to back, bound at birth.

        ``hold_signals``: keep the supervisor's signal handling in place after the call, until
        the run ends or :meth:`release_signals` (the caller's own handlers are back then), so
        that a teardown signal arriving before the caller's first :meth:`wait` is noted and
        acted on by it instead of reaching the caller's handlers while workers run unwatched.

        Every spec is checked first (UsageError / BindingError, nothing started). The watchdog
        is forked first and forks the ``"exec"`` and ``"fork"`` workers; ``"forkserver"``
        workers come from multiprocessing's fork server. If a worker still cannot start (exec
        or binding failure in the child, no process or fd left), the workers already started
        are killed (SIGKILL to their trees) and UsageError or BindingError is raised. Raises
        RuntimeError when called twice.
        """
        if self._phase != _NEW:
            raise RuntimeError("Supervisor.start() may be called once; make a new Supervisor")
        starter = _starter(self)
        starter.check()
        self._phase = _RUNNING
        flush_stdio()
        self._open_loop()
        # A teardown signal that arrives while workers start stops the start where it is (no
        # more workers are started) and is acted on by the next wait(); it neither kills us
        # half-way nor gets lost.
        scope = self._signal_scope()
        scope.__enter__()
        try:
            starter.start()
        except BaseException as exc:
            scope.__exit__(None, None, None)
            self._abort_start()
            raise start_error(exc) from exc
        if hold_signals:
            self._held_scope = scope
        else:
            scope.__exit__(None, None, None)

    def release_signals(self) -> None:
        """End what ``start(hold_signals=True)`` kept: the caller's own signal handlers are
        back. Done by itself when the run ends; nothing happens when nothing is held."""
        scope, self._held_scope = self._held_scope, None
        if scope is not None:
            scope.__exit__(None, None, None)

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
            return serve_started(self, on_started)

    def pids(self) -> list[int]:
        """The started workers' pids, by local rank (empty before :meth:`start`); 0 for a
        worker never started, and for a ``"forkserver"`` worker that ended before it could be
        pinned (its pid may be another process's already)."""
        return [0 if worker.lost else worker.pid for worker in self._workers]

    def wait(self, timeout: float | None = None, *, hold_failure: bool = False) -> RunResult | None:
        """Run the loop until the run ends; None if ``timeout`` seconds passed first
        (``wait(0)`` handles what is ready without waiting).

        The run ends when every worker succeeded (leftover owned processes are then torn down
        too), or after the teardown that follows the first failure, a teardown signal or
        :meth:`stop`. After it ended, returns the same RunResult again. If the loop itself raises
        (an output sink raising, say), every owned process is killed and the error propagates.

        ``hold_failure`` (a caller only looking, as ``Process.exitcode``): a failure observed
        now is recorded (``on_exit``, the first failure) but not acted on (no ``on_failure``, no
        teardown) until the next call without it, if the run is still running then."""
        if self._result is not None:
            return self._result
        if self._phase in (_NEW, _DONE):
            raise RuntimeError("Supervisor.wait() needs a successful start()")
        deadline = None if timeout is None else time.monotonic() + timeout
        finished = False
        self._holding_failure = hold_failure
        try:
            with self._signal_scope():
                self._take_status_lines()  # exits the watchdog reported while start() waited
                while self._early_signals:  # those read while the workers started
                    self._on_signal(self._early_signals.pop(0))
                finished = self._run_until(deadline)
        except BaseException:
            self._emergency_stop()
            raise
        finally:
            self._holding_failure = False
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
        interval, while the workers run (not during start or teardown); never cancelled."""
        self._loop.call_every(interval, callback)

    def call_later(self, delay: float, callback: Callable[[], None]) -> object:
        return self._loop.call_later(delay, callback)  # once; cancel() the handle it returns

    def add_reader(self, fd: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` from the loop whenever ``fd`` (the caller's; never closed here) is
        readable, until :meth:`remove_reader` (nothing when not watched) or the run's end."""
        self._loop.add_reader(fd, callback)

    def remove_reader(self, fd: int) -> None:
        self._loop.remove_reader(fd)  # nothing happens when fd is not watched

    def add_writer(self, fd: int, callback: Callable[[], None]) -> None:
        """:meth:`add_reader` for an fd to write to when it can take data (not both)."""
        self._loop.add_writer(fd, callback)

    def remove_writer(self, fd: int) -> None:
        self._loop.remove_writer(fd)

    def send_signal(self, signum: int, local_ranks: Sequence[int] | None = None) -> list[int]:
        """Send ``signum`` to each running worker process (not its group), or to those of
        ``local_ranks``; the local ranks reached. An exited worker (its pid reusable) never."""
        return self._teardown.signal_each(signum, local_ranks)

    def send_thread_signal(self, signum: int, threads: Mapping[int, int]) -> list[int]:
        """Send ``signum`` to one thread of each running worker, ``threads`` mapping its local
        rank to the thread's id (``tgkill``, only while that thread is the worker's); the local
        ranks reached. OSError without ``tgkill`` (:func:`.teardown.send_to_thread`)."""
        return self._teardown.signal_threads(signum, threads)

    def request_stop(self, reason: str) -> None:
        """Begin a teardown now (SIGTERM, SIGKILL after the grace period) without waiting; the
        run ends as usual, ``RunResult.stop_reason`` ``reason`` (a teardown signal meanwhile is
        its ``received_signal`` too). From loop callbacks; nothing once a teardown has begun."""
        if self._phase == _RUNNING:
            self._stop_reason = reason
            self._begin_teardown()

    # --- starting ------------------------------------------------------------------------------

    def _signal_scope(self) -> SignalScope:
        return SignalScope(
            self._loop.wakeup,
            self._teardown_signals,
            self._forward_signals,
            keep_ignored=self._keep_ignored,
        )

    def _open_loop(self) -> None:
        try:
            self._loop.open()
        except OSError as exc:  # out of fds: nothing started
            self._phase = _DONE
            raise start_error(exc) from exc

    def _abort_start(self) -> None:
        """A worker could not start: kill what started, release everything."""
        for worker in self._workers:
            if worker.pid == 0:
                worker.exited = True  # never started
        self._kill_everything()
        self._release()
        self._phase = _DONE

    # --- the loop ------------------------------------------------------------------------------

    def _run_until(self, deadline: float | None) -> bool:
        """Dispatch events and advance phases until done (True) or ``deadline`` (False).
        Events already waiting are dispatched even when ``deadline`` has passed (``wait(0)``)."""
        passes = 0
        while True:
            self._advance()
            if self._phase == _DONE:
                return True
            now = time.monotonic()
            if deadline is not None and now >= deadline and passes:
                return False
            passes += 1
            running = self._phase == _RUNNING
            phase_deadline = self._deadline if self._phase in _DEADLINED else None
            next_timer = self._loop.next_due() if running else None
            timeouts = [t for t in (deadline, phase_deadline, next_timer) if t is not None]
            timeout = max(0.0, min(timeouts) - now) if timeouts else None
            must_poll = not self._teardown.all_pinned()
            if must_poll:
                timeout = FALLBACK_TICK if timeout is None else min(timeout, FALLBACK_TICK)
            self._streams.watch_consoles()
            self._loop.poll(timeout)
            if must_poll:
                self._poll_workers()
            self._loop.run_due(lambda: self._phase == _RUNNING)

    def _poll_workers(self) -> None:
        for worker in self._workers:
            if not worker.exited:
                self._check_exit(worker)
        self._teardown.forget_gone()

    def _advance(self) -> None:
        """Phase transitions; called after every batch of events."""
        now = time.monotonic()
        if self._failure_waits and not self._holding_failure:
            self._failure_waits = False
            if self._phase == _RUNNING and self._first_failure is not None:
                self._act_on_failure(self._first_failure.as_exit())
        all_exited = all(worker.exited for worker in self._workers)
        if all_exited and not self._link.released:
            # No worker is signalled any more: the watchdog may reap them, and exit once nothing
            # is below it, while the last sweep and the output go on here (Link.release).
            self._link.release()
        if self._phase == _RUNNING and all_exited:
            self._begin_teardown()  # success: leftovers (daemonized grandchildren) go too
        if self._phase in (_TERMINATING, _KILLING):
            if all_exited and not self._teardown.tracking:
                signum = self._stop_signal if self._phase == _TERMINATING else signal.SIGKILL
                if not self._teardown.signal_owned(signum):
                    self._begin_draining()
            elif now >= self._deadline:
                if self._phase == _TERMINATING:
                    self._escalate()
                else:
                    self._teardown.give_up_on_survivors()
                    self._begin_draining()
        if self._phase == _DRAINING and (not self._streams.flowing() or now >= self._deadline):
            self._phase = _DONE

    def _console_progress(self) -> None:
        if self._phase == _DRAINING:
            # The reader is alive, only slow: give it time, as long as it makes progress.
            self._deadline = max(self._deadline, time.monotonic() + self.kill_wait)

    def _begin_teardown(self, received: int | None = None) -> None:
        self._phase = _TERMINATING
        self._deadline = time.monotonic() + self.grace_period
        if received is not None and self._relay_signal:
            self._stop_signal = received
        self._teardown.signal_run(self._stop_signal)

    def _escalate(self) -> None:
        self._phase = _KILLING
        self._deadline = time.monotonic() + self.kill_wait
        self._teardown.kill_run()

    def _begin_draining(self) -> None:
        self._phase = _DRAINING
        self._deadline = time.monotonic() + self.kill_wait
        for worker in self._workers:
            if worker.state == UNKILLABLE:
                # Its pipes may never reach end of file: stop reading them now.
                self._streams.close_outputs(worker)

    def _read_status(self) -> None:
        """The watchdog's lines: ``X <pid> <code>`` as workers end; end of file once it ended
        (after ``done``, or killed by someone: see :meth:`Link.orphans`)."""
        data = self._link.read()
        if data is None:
            return
        self._take_status_lines()
        if not data:
            assert self._link.status_fd is not None
            self._loop.unwatch(self._link.status_fd)
            self._link.close_status()
            for worker in self._link.orphans(self._workers):
                self._check_exit(worker)

    def _take_status_lines(self) -> None:
        for worker in self._link.ended(self._workers):
            self._check_exit(worker)

    # --- events --------------------------------------------------------------------------------

    def _check_exit(self, worker: Worker) -> None:
        code = worker.poll()
        if code is None:
            return
        worker.exited = True
        worker.exit_code = code
        worker.ended_at = time.time()
        self._unregister_exit_fd(worker)
        if worker.result_fd is not None:
            self._streams.read_result(worker, until_empty=True)
        self._streams.close_pipes_of_dead(worker)
        state = _state_of(worker, self._is_failure)
        worker.state = state
        ended = worker.as_exit()
        if state == FAILED and self._first_failure is None:
            self._first_failure = worker
            if self._phase == _RUNNING:
                if self._holding_failure:
                    self._failure_waits = True  # wait(hold_failure=True): only looking
                else:
                    self._act_on_failure(ended)
        if self._on_exit is not None:
            self._on_exit(ended)

    def _act_on_failure(self, ended: WorkerExit) -> None:
        if self._on_failure is not None:
            self._on_failure(ended)
        self._begin_teardown()

    def _stop_watching(self, worker: Worker) -> None:
        """A worker given up on (unkillable): its exit, payload and result are not awaited."""
        self._unregister_exit_fd(worker)
        self._streams.close_pipes_of_dead(worker)

    def _unregister_exit_fd(self, worker: Worker) -> None:
        if worker.exit_fd is None:
            return
        self._loop.unwatch(worker.exit_fd)
        worker.exit_fd = None

    def _on_signal(self, signum: int) -> None:
        """A signal the loop read from the wakeup socket."""
        if signum in self._teardown_signals:
            if self._phase == _RUNNING:
                self._received_signal = signum
                self._begin_teardown(signum)
            elif self._phase == _TERMINATING:
                if self._received_signal is None:  # whatever began it: the run ends on it
                    self._received_signal = signum  # (else lost: an attempt restarted)
                self._escalate()  # asked twice: skip the rest of the grace period
        elif signum in self._forward_signals:
            self.send_signal(signum)
        elif signum == signal.SIGCHLD:
            self._poll_workers()

    # --- the end -------------------------------------------------------------------------------

    def _finish(self) -> RunResult:
        self._streams.finish()
        self._result = _run_result(
            self._workers, self._first_failure, self._received_signal, self._stop_reason
        )
        self._release()
        self._phase = _DONE
        return self._result

    def _kill_everything(self) -> None:
        """SIGKILL every worker tree and owned process now; reap; bounded by ``kill_wait``."""
        self._phase = _KILLING
        self._deadline = time.monotonic() + self.kill_wait
        if self._loop.is_open:
            self._streams.watch_consoles(watch=False)  # killing only reaps; consoles wait
        self._teardown.kill_everything(self._deadline, self._poll_workers)

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
        """Close every fd, end the watchdog (it reaps the workers), give the caller's signal
        handlers back. Idempotent."""
        self.release_signals()
        for worker in self._workers:
            self._unregister_exit_fd(worker)
            if self._loop.is_open:
                self._streams.close_pipes_of_dead(worker)
            self._streams.close_outputs(worker)
            release_worker(worker)
        self._teardown.untrack_all()
        # The watchdog reaps the workers and exits; we reap it.
        if self._link.status_fd is not None:
            self._loop.discard(self._link.status_fd)
        self._link.end()
        if self._loop.is_open:
            self._streams.watch_consoles(watch=False)
        self._loop.close()


def serve_started(supervisor: Supervisor, on_started: Callable[[], None] | None) -> RunResult:
    """The rest of :meth:`Supervisor.run` once every worker started, inside the caller's signal
    scope: ``on_started()`` (an exception from it stops every worker at once and propagates),
    then :meth:`Supervisor.wait`."""
    if on_started is not None:
        try:
            on_started()
        except BaseException:
            supervisor._emergency_stop()
            raise
    result = supervisor.wait()
    assert result is not None
    return result


def _starter(run: Supervisor) -> Starter:
    """The start of ``run``'s workers, wired to its parts (:meth:`Supervisor.start`)."""
    return Starter(
        run._specs,
        run._workers,
        run._loop,
        run._link,
        run_id=run.run_id,
        kill_on_death=run._kill_on_death,
        kill_limit=max(1.0, run.kill_wait),
        remove_if_killed=run._remove_if_killed,
        keep_ignored=run._keep_ignored,
        watch_pipes=run._streams.watch,
        on_status=run._read_status,
        on_exit=run._check_exit,
        teardown_signals=run._teardown_signals,
        early_signals=run._early_signals,
        on_forked=run._on_forked,
    )


def _run_result(
    workers: list[Worker], first_failure: Worker | None, received: int | None, reason: str | None
) -> RunResult:
    exits = [worker.as_exit() for worker in workers]
    first = None if first_failure is None else exits[workers.index(first_failure)]
    unkillable = [ended for ended in exits if ended.state == UNKILLABLE]
    return RunResult(exits, first, received, unkillable, stop_reason=reason)


def _state_of(worker: Worker, is_failure: Callable[[WorkerExit], bool] | None) -> str:
    """The state of a worker that exited: terminated (by our signal), failed or succeeded."""
    code = worker.exit_code
    assert code is not None
    if worker.signalled and (code <= 0 or code >= 128):
        return TERMINATED
    if code != 0:
        return FAILED
    if is_failure is not None and is_failure(worker.as_exit(SUCCEEDED)):
        return FAILED
    return SUCCEEDED
