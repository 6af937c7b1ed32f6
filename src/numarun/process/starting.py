"""Starting a run's workers: checking the specs, forking the watchdog and the workers, the
forkserver path, awaiting the execs, delivering the payloads, and the one-line start errors.

What a start promises (the start methods, payloads, results, ``pass_fds``, the watchdog) is the
supervisor's contract, in :mod:`numarun.process.supervisor`; what runs in each child between
fork and its own code is :mod:`numarun.process.forkexec`. :meth:`Starter.start` does, in order:

1. Preparing (each worker, by local rank): its pipes, the supervisor's ends non-blocking and in
   the fd registry (a payload pipe the supervisor writes; result, stdout and stderr pipes it
   reads; payload and result pipes enlarged to :data:`numarun.process.forkexec.PIPE_SIZE`), and
   its environment: the spec's, with ``NUMARUN_RUN_ID`` and, for ``"exec"``, the
   ``NUMARUN_PAYLOAD_FD`` / ``NUMARUN_RESULT_FD`` of the child's ends.
2. Forking the watchdog, with a command pipe and a status pipe. In the forked copy, which uses
   only plain ``os`` calls (another thread of the caller may have held a lock at fork time,
   never released in this copy): SIGCHLD at its default action (a caller that ignores it
   would have the kernel reap the workers), no wakeup fd, a child subreaper, then at once, with
   every signal blocked, the ``"fork"`` workers and then the ``"exec"`` ones (each with a
   close-on-exec error pipe), looking at the command pipe between two forks (``abort``: a
   teardown signal came, fork no more), garbage collection off, a process group of its own,
   every fd closed but its pipes, stdin, stdout and stderr on ``/dev/null``; it writes
   ``P <pids>`` (and the ``E`` line of a worker it could not fork) and serves
   (:class:`numarun.process.watchdog.Watchdog`). The supervisor waits for the ``P`` line, then
   closes its copies of the children's ends of their pipes.
3. The ``"forkserver"`` workers, one by one, from :mod:`multiprocessing`'s fork server (started
   once per process): each is pinned by a pidfd at once and proven to be the child the fork
   server made (:func:`_pin_forkserver_child`: the fork server reaps it, its pid could be
   reused), then named to the watchdog (``F <pid> <start time>``), which kills it if the
   supervisor dies. One that cannot be proven (it ended at once) is *lost*: its exit status
   still comes through its sentinel, but it is never signalled or searched by pid.
4. Registering each worker in the loop: a forkserver worker's sentinel (its end; the others'
   come from the watchdog) and its pipes (``watch_pipes``: :mod:`numarun.process.streams`).
5. Awaiting every exec (the watchdog's ``R``), or raising the first error it reports; exits
   reported meanwhile are kept for the loop.
6. Delivering the payloads, to all workers at once, serving only transfers, output and the
   callers' readers (:mod:`numarun.process.loop`), for at most :data:`_START_LIMIT` seconds;
   what a child has not read by then is left to the loop.

Each step waits at most :data:`_START_LIMIT` seconds for the watchdog (which reports a worker
that does not exec within :data:`numarun.process.watchdog.EXEC_LIMIT` itself), and wakes for a
signal meanwhile: a teardown signal stops the start where it is (:meth:`Starter.start`). A step
that raises leaves what was started to the caller, which kills it; workers never forked have
pid 0.

Errors are one line: :func:`check_arguments` (a Supervisor's arguments) and
:func:`validate_spec` (each spec, when the start begins) raise
:class:`~numarun.errors.UsageError` or :class:`~numarun.errors.BindingError` before anything
starts; :func:`child_error` turns a child's ``stage:errno:message`` report into one;
:func:`start_error` turns an ``OSError`` (no process or fd left) into a UsageError with what
to do about the limit that was reached.
"""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import select
import signal
import sys
import time
from functools import partial

from numarun.errors import BindingError, UsageError
from numarun.placement import binding
from numarun.process import forkexec, proctable, watchdog
from numarun.process.loop import ENDS, OUTPUT, READ, READERS, TRANSFERS
from numarun.process.record import Worker
from numarun.process.signals import SignalScope
from numarun.process.spec import (
    NOT_STARTED,
    PAYLOAD_FD_ENV,
    RESULT_FD_ENV,
    RUN_ID_ENV,
    START_METHODS,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence
    from typing import Any

    from numarun.process.loop import Loop
    from numarun.process.spec import WorkerSpec

_START_LIMIT = watchdog.EXEC_LIMIT + 10.0  # the watchdog reports a late exec itself


# --- checking ------------------------------------------------------------------------------------


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


def validate_spec(spec: WorkerSpec) -> str:
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
    if spec.make_dir is not None and spec.start != "exec":
        raise UsageError(f"{who}: make_dir is for start='exec' workers only")
    if spec.payload is not None and not isinstance(spec.payload, (bytes, bytearray, memoryview)):
        raise UsageError(f"{who}: payload must be bytes, not {type(spec.payload).__name__}")
    if not all(isinstance(fd, int) and fd >= 0 for fd in spec.pass_fds):
        raise UsageError(f"{who}: pass_fds must be fd numbers >= 0, got {spec.pass_fds!r}")
    if spec.cwd is not None and not os.path.isdir(spec.cwd):
        raise UsageError(f"{who}: working directory {spec.cwd!r} does not exist")
    if spec.cpus is not None:
        binding.check_cpus(spec.cpus, rank=spec.local_rank)
    return resolved


def check_arguments(
    specs: Sequence[WorkerSpec],
    grace_period: float,
    kill_wait: float,
    teardown: Sequence[int],
    forward: Sequence[int],
) -> None:
    """Raise UsageError (one line) for a Supervisor's arguments that cannot make a run."""
    if not specs:
        raise UsageError("no workers to start; give at least one WorkerSpec")
    ranks = [spec.local_rank for spec in specs]
    if len(set(ranks)) != len(ranks):
        raise UsageError(f"local ranks must be unique, got {ranks}")
    if grace_period < 0 or kill_wait < 0:
        raise UsageError("grace_period and kill_wait must be >= 0 seconds")
    check_signals(teardown, forward)


def check_signals(teardown: Sequence[int], forward: Sequence[int]) -> None:
    """Raise UsageError for a signal the supervisor cannot handle, or asked for twice."""
    uncatchable = {signal.SIGKILL, signal.SIGSTOP}
    for signum in (*teardown, *forward):
        if signum in uncatchable or signum == signal.SIGCHLD:
            raise UsageError(f"signal {signum} cannot be handled by the supervisor")
    both = set(teardown) & set(forward)
    if both:
        raise UsageError(
            f"signal(s) {sorted(both)} are both teardown and forward signals; choose one"
        )


# --- starting ------------------------------------------------------------------------------------


def flush_stdio() -> None:
    """Flush ``sys.stdout`` and ``sys.stderr``: forked children would print the buffered text
    again."""
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            pass


class Starter:
    """Starts the workers of ``specs`` (sorted by local rank) into ``workers``, the supervisor's
    list (module docstring). ``watch_pipes(worker)`` puts a started worker's pipes in the loop;
    ``on_status()`` is called from the loop when the watchdog's status pipe is readable,
    ``on_exit(worker)`` when a forkserver worker's sentinel is.

    ``run_id`` goes into the workers' environment; if the supervisor dies, the watchdog kills
    the run (``kill_on_death``) for at most ``kill_limit`` seconds, looking, when the run has
    forkserver workers, for processes whose environment holds ``NUMARUN_RUN_ID=<run id>``, and
    removes ``remove_if_killed`` (see :class:`numarun.process.supervisor.Supervisor`). A signal
    of ``keep_ignored`` that the caller ignores stays ignored in ``"exec"`` workers; every other
    ignored disposition is reset to the default action before exec."""

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        workers: list[Worker],
        loop: Loop,
        link: watchdog.Link,
        *,
        run_id: str,
        kill_on_death: bool,
        kill_limit: float,
        remove_if_killed: str | None,
        keep_ignored: Sequence[int],
        watch_pipes: Callable[[Worker], None],
        on_status: Callable[[], None],
        on_exit: Callable[[Worker], None],
        teardown_signals: Sequence[int] = (),
        early_signals: list[int] | None = None,
    ) -> None:
        self._specs = specs
        self._workers = workers
        self._loop = loop
        self._link = link
        self._run_id = run_id
        self._marker = f"{RUN_ID_ENV}={run_id}".encode()
        self._forkserver = any(spec.start == "forkserver" for spec in specs)
        self._kill_on_death = kill_on_death
        self._kill_limit = kill_limit
        self._remove_if_killed = remove_if_killed
        self._keep_ignored = frozenset(keep_ignored)
        self._watch_pipes = watch_pipes
        self._on_status = on_status
        self._on_exit = on_exit
        self._teardown_signals = frozenset(teardown_signals)
        # Signals read while the workers start, for the supervisor's next wait().
        self.early_signals = [] if early_signals is None else early_signals
        self._programs: dict[int, str] = {}
        self.stopped = False  # a teardown signal stopped the start: some workers not started

    def check(self) -> None:
        """Check every spec (UsageError / BindingError, one line); starts nothing."""
        self._programs = {spec.local_rank: validate_spec(spec) for spec in self._specs}

    def start(self) -> None:
        """Steps 1 to 6 of the module docstring, after :meth:`check`. Raises what stopped a
        worker from starting.

        Whenever it waits for the watchdog it also wakes for a signal, which it reads into
        :attr:`early_signals` (for the supervisor's next wait). Once one of
        ``teardown_signals`` came, the start stops where it is (:attr:`stopped`): the watchdog
        forks no more workers, no more forkserver workers are started, execs and payloads are
        not waited for; the workers never started have pid 0 and the state
        ``"not started"``."""
        for spec in self._specs:
            self._workers.append(self._prepare_worker(spec))
        self._start_watchdog()
        for worker in self._workers:
            if worker.spec.start == "forkserver":
                if self.stopped or self._interrupted():
                    self.stopped = True
                    continue
                self._forkserver_worker(worker)
            self._register_worker(worker)
        self._await_started()
        if not self.stopped:
            self._deliver_payloads()
            return
        for worker in self._workers:
            if worker.pid == 0:
                worker.exited = True
                worker.state = NOT_STARTED

    def _prepare_worker(self, spec: WorkerSpec) -> Worker:
        """The worker's pipes and environment; nothing started yet."""
        worker = Worker(spec)
        worker.env = dict(spec.env)
        worker.env[RUN_ID_ENV] = self._run_id
        try:
            if spec.payload is not None:
                worker.payload_fd, worker.payload_child = forkexec.parent_pipe(parent_reads=False)
                forkexec.enlarge_pipe(worker.payload_fd)
                worker.payload_view = memoryview(spec.payload).cast("B")
                worker.child_fds.append(worker.payload_child)
            if spec.want_result:
                worker.result_fd, worker.result_child = forkexec.parent_pipe(parent_reads=True)
                forkexec.enlarge_pipe(worker.result_fd)
                worker.child_fds.append(worker.result_child)
            for name, sink in (("stdout", spec.stdout), ("stderr", spec.stderr)):
                if sink is not None:
                    parent_end, child_end = forkexec.parent_pipe(parent_reads=True)
                    worker.outputs[parent_end] = sink
                    worker.streams[name] = child_end
                    worker.child_fds.append(child_end)
        except BaseException:
            for fd in (worker.payload_fd, worker.result_fd, *worker.outputs, *worker.child_fds):
                forkexec.close(fd)
            raise
        if spec.start == "exec":
            if spec.payload is not None:
                worker.env[PAYLOAD_FD_ENV] = str(worker.payload_child)
            if spec.want_result:
                worker.env[RESULT_FD_ENV] = str(worker.result_child)
        return worker

    def _start_watchdog(self) -> None:
        """Fork the watchdog, which forks every exec and fork worker; read their pids."""
        command_w, command_r = forkexec.parent_pipe(parent_reads=False)
        status_r, status_w = forkexec.parent_pipe(parent_reads=True)
        os.set_blocking(command_w, True)
        try:
            pid = forkexec.fork()
            if pid == 0:
                self._become_watchdog(command_r, status_w)
        except BaseException:
            for fd in (command_r, command_w, status_r, status_w):
                forkexec.close(fd)
            self._close_child_ends()
            raise
        forkexec.close(command_r)
        forkexec.close(status_w)  # so that a watchdog that dies gives us end of file
        self._link.attach(pid, command_w, status_r)
        self._loop.watch(status_r, READ, self._on_status, ENDS)
        forked = [w for w in self._workers if w.spec.start != "forkserver"]
        try:
            # Waiting first lets the watchdog run at once where the CPUs are busy; our copies
            # of the workers' ends of their pipes can be closed afterwards.
            words = self._status_line(time.monotonic() + _START_LIMIT).split()
        finally:
            self._close_child_ends()
        if not words or words[0] != b"P" or len(words) - 1 != len(forked):
            raise UsageError("the watchdog process ended while starting workers")
        for worker, word in zip(forked, words[1:], strict=True):
            worker.pid = int(word)
            worker.exited = worker.pid == 0  # not forked: the "E" line that follows says why

    def _close_child_ends(self) -> None:
        """Our copies of the exec and fork workers' ends of their pipes (the watchdog has its
        own, and hands them on)."""
        for worker in self._workers:
            if worker.spec.start != "forkserver":
                for fd in worker.child_fds:
                    forkexec.close(fd)
                worker.child_fds.clear()

    def _become_watchdog(self, command_fd: int, status_fd: int) -> None:
        """In the forked watchdog: become a subreaper, fork the workers, serve; never returns.

        Only plain os calls here: another thread of the caller may have held a lock (the fd
        registry's, an import's) at fork time, and it will never be released in this copy.
        """
        try:
            # First: a caller that ignores SIGCHLD would have the kernel reap our workers at
            # once (no exit status, no zombie holding the pid), and SIG_IGN would reach them.
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            with contextlib.suppress(ValueError):
                signal.set_wakeup_fd(-1)  # the supervisor's socket, closed below
            # Without these two the watchdog still works, with less coverage: orphans would go
            # to init, and the shell's kill -9 -PGID would kill the watchdog too.
            with contextlib.suppress(OSError):
                binding.set_child_subreaper(True)
            # The workers at once: every step before them delays the job's start. The
            # supervisor's ends of our pipes are tracked fds, which forked workers close, and
            # exec'd ones close every fd; they are closed here below.
            pids, checks, failure = self._fork_workers(os.getpid(), command_fd)
            # Not before the workers, whose "fork" kind would inherit it: a collection would
            # write to every object of the caller's heap, copying each page of it into this
            # process (copy-on-write); the little the watchdog allocates can wait.
            gc.disable()
            with contextlib.suppress(OSError):
                os.setpgid(0, 0)
            # The watchdog holds nothing of the caller's: no file, socket or terminal.
            keep = sorted({command_fd, status_fd, *checks})
            for low, high in zip([-1, *keep], [*keep, 1 << 20], strict=True):
                if high > low + 1:
                    os.closerange(low + 1, high)
            with contextlib.suppress(OSError):
                null = os.open(os.devnull, os.O_RDWR)
                for target in (0, 1, 2):
                    if target not in keep and target != null:
                        os.dup2(null, target)
                if null > 2:
                    os.close(null)
            os.write(status_fd, b"P %s\n" % b" ".join(b"%d" % pid for pid in pids))
            if failure:
                os.write(status_fd, failure)
                proctable.close_all(checks)
                checks = {}
            watchdog.Watchdog(
                command_fd,
                status_fd,
                [pid for pid in pids if pid],
                checks,
                kill_on_death=self._kill_on_death,
                kill_limit=self._kill_limit,
                marker=self._marker if self._forkserver else None,
                uid=os.getuid(),
                remove_dir=self._remove_if_killed,
            ).serve()
        finally:
            os._exit(1)

    def _fork_workers(
        self, me: int, command_fd: int
    ) -> tuple[list[int], dict[int, int], bytes]:
        """In the watchdog: fork every exec and fork worker. Returns their pids in order (0: not
        started), each exec worker's error pipe -> its index, and the ``E`` line of a failure.

        Between two forks the command pipe is looked at: ``abort`` (a teardown signal reached
        the supervisor) or its end of file (the supervisor died) stops the forking at once;
        the pids of the workers not forked are 0, with no ``E`` line."""
        order = [w for w in self._workers if w.spec.start != "forkserver"]
        commands = select.poll()
        commands.register(command_fd, select.POLLIN)
        # "fork" workers first: they keep fds that are not in the registry, and none of the
        # exec workers' error pipes exists yet.
        fork_first = sorted(range(len(order)), key=lambda k: order[k].spec.start != "fork")
        pids = [0] * len(order)
        checks: dict[int, int] = {}
        # What an exec worker gets at the default action, first thing: the signals handled
        # here (the supervisor's handlers, which would swallow a teardown signal until exec
        # resets them) and every disposition ignored here but those kept on purpose (SIGHUP
        # under nohup), which exec would keep.
        catchable = signal.valid_signals() - {signal.SIGKILL, signal.SIGSTOP}
        reset: list[int] = []
        if any(worker.spec.start == "exec" for worker in order):
            # (Only exec workers use it: a fork worker runs under the caller's handlers, and
            # every step here delays the first fork.)
            handled = {s for s in catchable if callable(signal.getsignal(s))}
            ignored = {s for s in forkexec.ignored_signals() if s not in self._keep_ignored}
            reset = sorted(handled | ignored)
        # Blocked while forking: a signal sent to a child before it reset its handlers waits
        # for them (it kills the child then, as it would kill the program it becomes).
        mask = forkexec.set_signal_mask(signal.SIG_BLOCK, catchable)
        try:
            for index in fork_first:
                if commands.poll(0):
                    break  # "abort", or end of file: serve() reads the latter again
                try:
                    pids[index], check_fd = self._fork_worker(order[index], me, reset, mask)
                except OSError as exc:
                    reason = (exc.strerror or str(exc)).encode(errors="replace")
                    return pids, checks, b"E %d fork:%d:%s\n" % (index, exc.errno or 0, reason)
                if check_fd is not None:
                    checks[check_fd] = index
        finally:
            forkexec.set_signal_mask(signal.SIG_SETMASK, mask)
        return pids, checks, b""

    def _fork_worker(
        self, worker: Worker, parent_pid: int, reset: Sequence[int], mask: set[int]
    ) -> tuple[int, int | None]:
        """In the watchdog, with every signal blocked: fork one exec or fork worker; (pid, read
        end of its error pipe). ``reset``: the signals an exec worker sets to their default
        action before it unblocks them all; ``mask``: the signal mask a fork worker gets back
        (the caller's)."""
        spec = worker.spec
        if spec.start == "fork":
            keep = {
                fd
                for fd in (
                    worker.payload_child,
                    worker.result_child,
                    *worker.streams.values(),
                    *spec.pass_fds,
                )
            }
            keep.discard(-1)
            pid = forkexec.fork()
            if pid == 0:
                forkexec.fork_child(
                    keep,
                    parent_pid,
                    spec,
                    worker.env,
                    worker.payload_child,
                    worker.result_child,
                    worker.streams.get("stdout"),
                    worker.streams.get("stderr"),
                    SignalScope.restore_callers_handlers,
                    mask,
                )
            return pid, None
        check_r, check_w = os.pipe()
        try:
            pid = forkexec.fork()
            if pid == 0:
                forkexec.exec_child(
                    check_w,
                    parent_pid,
                    spec,
                    self._programs[spec.local_rank],
                    worker.env,
                    [
                        *(fd for fd in worker.child_fds if fd not in worker.streams.values()),
                        *spec.pass_fds,
                    ],
                    worker.streams.get("stdout"),
                    worker.streams.get("stderr"),
                    reset,
                )
        except BaseException:
            os.close(check_r)
            raise
        finally:
            os.close(check_w)
        return pid, check_r

    def _status_line(self, deadline: float) -> bytes:
        """The next line from the watchdog, blocking until ``deadline``; b"" at end of file.
        A teardown signal meanwhile stops the start (:meth:`_stop`), and the wait goes on for
        what the watchdog says next."""
        while True:
            wake = None if self.stopped else self._loop.signal_fd
            line = self._link.line(deadline, wake)
            if line is None:
                raise UsageError("the watchdog process did not answer while starting workers")
            if line != watchdog.WOKEN:
                return line
            if self._interrupted():
                self._stop()

    def _interrupted(self) -> bool:
        """Whether a teardown signal came (every signal read is kept in early_signals)."""
        self.early_signals += self._loop.take_signals()
        return any(signum in self._teardown_signals for signum in self.early_signals)

    def _stop(self) -> None:
        """A teardown signal came: the watchdog forks no more workers."""
        self.stopped = True
        self._link.tell(b"abort\n")

    def _deliver_payloads(self) -> None:
        """Write every payload now, to all children at once, so that workers run whether or not
        anyone waits; what a child has not read within ``_START_LIMIT`` stays with the loop.
        What the workers send meanwhile (results, output, the caller's readers) is read as the
        loop reads it, so a worker that answers while it reads cannot stall us; exits wait for
        the loop, and a teardown signal ends the delivery (:attr:`early_signals`)."""
        deadline = time.monotonic() + _START_LIMIT
        while any(w.payload_fd is not None for w in self._workers):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            self._loop.poll(left, lanes=(TRANSFERS, OUTPUT, READERS))
            wake = self._loop.signal_fd
            if wake is not None and proctable.readable(wake) and self._interrupted():
                return  # a teardown signal: what is left goes with the teardown

    def _await_started(self) -> None:
        """Wait until every exec worker exec'd (the watchdog's ``R``); raise the first error as
        UsageError (exec) or BindingError (binding), one line. Exits reported meanwhile are
        kept for the loop."""
        forked = [w for w in self._workers if w.spec.start != "forkserver"]
        deadline = time.monotonic() + _START_LIMIT
        held: list[bytes] = []
        try:
            while not self.stopped:
                line = self._status_line(deadline)
                if self.stopped:
                    held.append(line)
                    return
                if not line:
                    raise UsageError("the watchdog process ended while workers were starting")
                if line == b"R":
                    return
                if line.startswith(b"E "):
                    _, index, report = line.split(b" ", 2)
                    worker = forked[int(index)]
                    raise child_error(worker.spec, report.decode(errors="replace"))
                held.append(line)
        finally:
            self._link.hold(held)

    def _forkserver_worker(self, worker: Worker) -> None:
        import multiprocessing
        import pickle
        from multiprocessing import forkserver

        spec = worker.spec
        context = multiprocessing.get_context("forkserver")
        forkserver.ensure_running()
        server_pid = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)

        def inherited(fd: int | None) -> forkexec.InheritedFd | int | None:
            if fd is None:
                return None
            return -1 if fd < 0 else forkexec.InheritedFd(fd)

        process = context.Process(
            target=forkexec.forkserver_child,
            args=(
                spec.fork_target,
                server_pid,
                tuple(spec.cpus) if spec.cpus is not None else None,
                spec.mem,
                worker.env,
                spec.cwd,
                inherited(worker.payload_child),
                inherited(worker.result_child),
                inherited(worker.streams.get("stdout")),
                inherited(worker.streams.get("stderr")),
                tuple(forkexec.InheritedFd(fd) for fd in spec.pass_fds),
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
        finally:
            for fd in worker.child_fds:
                forkexec.close(fd)
            worker.child_fds.clear()
        # The supervisor waits for it and closes it: multiprocessing's exit handler must not
        # join it too (it would find it closed).
        _forget_child(process)
        worker.process = process
        worker.pid = process.pid
        worker.pidfd, started = _pin_forkserver_child(worker.pid, server_pid, process.sentinel)
        if worker.pidfd is not None:
            forkexec.track(worker.pidfd)
        if started is None:
            # Ended before it could be pinned, its pid perhaps someone else's already: never
            # signalled, never searched; its exit status still comes through its sentinel.
            worker.lost = True
            return
        # Not the watchdog's child: it must be told, to kill it if we die.
        self._link.tell(b"F %d %d\n" % (worker.pid, started))

    def _register_worker(self, worker: Worker) -> None:
        if worker.process is not None:  # the others' exits come from the watchdog
            worker.exit_fd = worker.process.sentinel
            self._loop.watch(worker.exit_fd, READ, partial(self._on_exit, worker), ENDS)
        self._watch_pipes(worker)


def _pin_forkserver_child(
    pid: int, server_pid: int | None, sentinel: int
) -> tuple[int | None, int | None]:
    """Pin the fork server's new child ``pid``: (its pidfd or None, its start time), or
    (None, None) when what holds ``pid`` now cannot be shown to be that child.

    The fork server reaps its children itself, so a child that died at once may have left its
    pid to another process before the pidfd was opened. Proof that the pidfd is the child's:
    the pidfd was opened, and ``/proc/<pid>/stat`` read after it, before the child's
    ``sentinel`` turned readable (the fork server writes the exit status there right after it
    reaped the child: until then the child holds its pid), and that stat names the fork server
    (``server_pid``, when known) as the parent. Without pidfds the same checks are made by
    pid."""
    try:
        fd = proctable.open_pidfd(pid)
    except ProcessLookupError:
        return None, None  # ended and reaped already
    info = proctable.read_proc_stat(pid)
    started = proctable.start_time(pid)
    ours = (
        info is not None
        and started is not None
        and (server_pid is None or info[0] == server_pid)
        and not proctable.readable(sentinel)
    )
    if not ours:
        proctable.close_all([fd])
        return None, None
    return fd, started


# --- releasing, and errors ----------------------------------------------------------------------


def release_worker(worker: Worker) -> None:
    """Release what the start holds for ``worker`` besides its pipes: the children's ends of
    its pipes, its pidfd, its forkserver Process. Idempotent."""
    if worker.process is not None:
        _forget_process(worker)
    for fd in worker.child_fds:
        forkexec.close(fd)
    worker.child_fds.clear()
    forkexec.close(worker.pidfd)
    worker.pidfd = None


def _forget_process(worker: Worker) -> None:
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


def start_error(exc: BaseException) -> BaseException:
    """The one-line error for a worker that could not start."""
    if isinstance(exc, OSError) and not isinstance(exc, (UsageError, BindingError)):
        return UsageError(f"cannot start a worker: {exc.strerror or exc}{_limit_hint(exc.errno)}")
    return exc


def _limit_hint(code: int | None) -> str:
    """What to do when processes or fds ran out (EMFILE, ENFILE, EAGAIN from fork)."""
    if code in (errno.EMFILE, errno.ENFILE):
        try:
            import resource

            limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        except (ImportError, OSError, ValueError):
            return "; raise the open-file limit (ulimit -n) or run fewer ranks"
        return f"; the open-file limit is {limit}: raise it (ulimit -n) or run fewer ranks"
    if code == errno.EAGAIN:
        return "; the process limit (ulimit -u) or the machine's is reached"
    return ""


def child_error(spec: WorkerSpec, report: str) -> BaseException:
    """The one-line error for a child's ``stage:errno:message`` report (stages ``setup``,
    ``dir``, ``bind`` and ``exec`` from the child, ``fork`` and ``late`` from the watchdog)."""
    stage, _, rest = report.partition(":")
    code, _, detail = rest.partition(":")
    who = f"local rank {spec.local_rank}"
    if stage == "bind":
        return BindingError(
            f"{who}: binding failed in the child ({detail}); check the CPU list and memory "
            "policy with `numarun plan`"
        )
    if stage == "exec":
        return UsageError(f"{who}: cannot start {spec.argv[0] if spec.argv else '?'}: {detail}")
    if stage == "dir":
        return UsageError(f"{who}: cannot make its directory {spec.make_dir!r} ({detail})")
    if stage == "fork":
        hint = _limit_hint(int(code)) if code.isdigit() else ""
        return UsageError(f"{who}: could not start a process ({detail}){hint}")
    if stage == "late":
        return UsageError(
            f"{who} did not reach exec within {watchdog.EXEC_LIMIT:.0f} s after fork "
            "(a lock held by another thread at fork time?)"
        )
    return UsageError(f"{who}: could not prepare the worker process ({detail})")
