"""The watchdog: parent of a run's workers, reaper of everything they leave, and their killer if
the supervisor dies. What it reads of ``/proc`` to find a run's processes, and the pidfds that
keep it from ever signalling another, are :mod:`numarun.process.proctable`.

Why a process of its own: a process whose parent dies is adopted by the nearest *child
subreaper* among its ancestors (else by init). The supervisor forks the watchdog (a copy of
itself: no interpreter to start, no program looked up on ``PATH``), the watchdog makes itself a
child subreaper and forks the workers. Every process a worker ever starts therefore stays below
the watchdog however it detaches (double fork, ``setsid``, an empty environment, a nested
numarun whose own watchdog dies first), and nothing outside the run is ever below it: the run is
exactly the watchdog's descendants. The supervisor itself is not a subreaper, so orphans of
its caller's other processes never come to it.

Protocol. Watchdog to supervisor (the status pipe), ASCII lines:

* ``P <pid> <pid> ...`` once, the workers forked, in the order they were given;
* ``R`` once every exec worker exec'd, or instead ``E <index> <stage>:<errno>:<message>`` for
  the first that could not (``fork`` stage: the watchdog could not fork it; ``late``: no exec
  within the time limit);
* ``X <pid> <code>`` as each worker ends (``code`` as :class:`subprocess.Popen`: -N = signal
  N). The watchdog keeps ended workers as zombies (``waitid(WNOWAIT)``) until ``done``, so
  that a worker's pid, and with it its process group and session id, cannot be reused while
  the supervisor might still signal it; orphans adopted from the run are reaped at once.

Supervisor to watchdog (the command pipe): ``F <pid> <start time>`` names a ``"forkserver"``
worker (a child of multiprocessing's fork server, not of the watchdog), which the watchdog pins
with a pidfd if that pid still has that start time (``/proc/<pid>/stat``, field 22).
``abort``, while the watchdog forks the workers: fork no more (a teardown signal came). ``done``
means the supervisor has read every worker's end and signals them no more: the watchdog reaps
them, and exits 0 as soon as it has no live child left (every process of the run descends from
a live child of the watchdog, so then none is left, and none can appear), or at end of file.
End of file without ``done`` means the supervisor died (even by SIGKILL: the kernel closes its
end). The watchdog then SIGKILLs every descendant of its own until it has no children left or
``kill_limit`` seconds passed; in a run with forkserver workers also those workers, their
descendants, the processes in their sessions while they hold their pid, and every process of
the supervisor's real uid whose ``/proc/<pid>/environ`` holds ``NUMARUN_RUN_ID=<run id>``;
removes ``remove_dir`` if given; then exits 0. Its workers, whose parent it is, get no
parent-death signal while it lives, so it finds their trees intact.

The supervisor's end of both pipes is a :class:`Link`: the watchdog's pid, the command pipe, and
the status pipe cut into lines: ``P``, ``R`` and ``E`` are read while the workers start
(:mod:`numarun.process.starting`), ``X`` as the run goes on (:meth:`Link.exits`).
:meth:`Link.release` writes ``done`` (the supervisor does so as soon as it has read every
worker's end, so that the watchdog's exit overlaps with the supervisor's last sweep and
draining); :meth:`Link.end` writes it if not yet written, closes both pipes and reaps the
watchdog, SIGKILLing it if it has not exited within two seconds, and waiting at most two seconds
more.

The watchdog runs in its own process group (``kill -9 -PGID`` of the supervisor's group, as a
shell's job control sends, spares it) and ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT. If it is
itself killed, the workers get SIGKILL from the kernel (``PR_SET_PDEATHSIG``, set in each
worker) and their descendants are adopted by whatever is above it: the one case where numarun
loses track of a run's processes. It shares its memory pages with the supervisor's process
(copy-on-write): they count in its resident size as ``ps`` shows it, not twice in the machine's
memory.
"""

from __future__ import annotations

import _signal as signal  # not signal.py, whose enums cost a launch ~2 ms (DESIGN.md)
import os
import select
import sys
import time

from numarun.errors import suppress
from numarun.process import forkexec
from numarun.process.proctable import (
    FALLBACK_TICK,
    ancestors,
    children_of_self,
    close_all,
    find_run_processes,
    has_exited,
    is_alive,
    open_pidfd,
    read_proc_table,
    read_subtree,
    readable,
    send,
    start_time,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from numarun.process.record import Worker

EXEC_LIMIT = 60.0  # seconds from fork to exec before a worker is reported "late"
WOKEN = b"\0"  # Link.line(): the wake fd turned readable first (no status line holds a NUL)
_END_WAIT = 2.0  # seconds the supervisor waits for the watchdog to exit after "done"


class Watchdog:
    """The watchdog's state, in the process the supervisor forked (see the module docstring).

    ``workers``: the pids it forked, in order; ``checks``: the read end of each exec worker's
    close-on-exec error pipe -> the worker's index in ``workers``. :meth:`serve` never returns.
    """

    def __init__(
        self,
        command_fd: int,
        status_fd: int,
        workers: list[int],
        checks: dict[int, int],
        *,
        kill_on_death: bool,
        kill_limit: float,
        marker: bytes | None,
        uid: int,
        remove_dir: str | None,
    ) -> None:
        self.command_fd = command_fd
        self.status_fd = status_fd
        self.workers = list(workers)
        self.unreported = set(workers)
        self.checks = dict(checks)
        self.check_reports: dict[int, bytes] = {}
        self.exec_deadline = time.monotonic() + EXEC_LIMIT
        self.kill_on_death = kill_on_death
        self.kill_limit = kill_limit
        self.marker = marker
        self.uid = uid
        self.remove_dir = remove_dir
        self.forkserver_workers: dict[int, int | None] = {}  # pid -> pidfd
        self.started = start_time(os.getpid())  # no process of the run is older
        self.done = False  # the supervisor read every worker's end: they may be reaped
        self.wake_r = self.wake_w = -1

    def serve(self) -> None:
        """Report, reap and wait for ``done``; kill the run if the supervisor dies. Exits."""
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
            signal.signal(signum, signal.SIG_IGN)
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w, warn_on_full_buffer=False)
        signal.signal(signal.SIGCHLD, _ignore)  # a handler, not SIG_IGN: zombies must stay
        if not self.checks:
            self._report(b"R\n")  # before any exit report: the supervisor reads it first
        self._collect()
        command = b""
        while True:
            watched = [self.command_fd, self.wake_r, *self.checks]
            timeout = max(0.0, self.exec_deadline - time.monotonic()) if self.checks else None
            ready = _readable(watched, timeout)
            if self.wake_r in ready:
                _drain(self.wake_r)
                self._collect()
            for fd in ready:
                if fd in self.checks:
                    self._read_check(fd)
            if self.checks and time.monotonic() >= self.exec_deadline:
                self._report(b"E %d late:0:no exec\n" % min(self.checks.values()))
                self._forget_checks()
            if self.command_fd in ready:
                data = os.read(self.command_fd, 4096)
                *lines, command = (command + data).split(b"\n")
                for line in lines:
                    self._obey(line)
                if not data:
                    if self.done:
                        self._finish()  # the supervisor ended the run and closed its end
                    self._supervisor_died()

    # --- while the run goes on ---------------------------------------------------------------

    def _obey(self, line: bytes) -> None:
        words = line.split()
        if words == [b"done"]:
            self.done = True
            self._collect()
        elif len(words) == 3 and words[0] == b"F" and words[1].isdigit():
            pid = int(words[1])
            try:
                fd = open_pidfd(pid)
            except ProcessLookupError:
                return
            if start_time(pid) == int(words[2]) and not has_exited(fd):
                self.forkserver_workers[pid] = fd
            else:
                close_all([fd])  # ended already, its pid maybe someone else's

    def _report(self, line: bytes) -> None:
        # A supervisor that died stops reading: its end of file follows on the command pipe.
        with suppress(OSError):
            os.write(self.status_fd, line)

    def _read_check(self, fd: int) -> None:
        data = os.read(fd, 4096)
        if data:
            self.check_reports[fd] = self.check_reports.get(fd, b"") + data
            return
        index = self.checks.pop(fd)
        os.close(fd)
        if fd in self.check_reports:
            report = self.check_reports.pop(fd).replace(b"\n", b" ")
            self._report(b"E %d %s\n" % (index, report))
            self._forget_checks()
        elif not self.checks:
            self._report(b"R\n")

    def _forget_checks(self) -> None:
        """After an error is reported the supervisor stops the run; no more exec reports."""
        close_all(self.checks)
        self.checks.clear()
        self.check_reports.clear()

    def _collect(self) -> None:
        """Report workers that ended (kept as zombies); reap adopted orphans at once."""
        for pid in sorted(self.unreported):
            try:
                ended = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                code = -signal.SIGKILL  # cannot happen: only we reap our children
            else:
                if ended is None:
                    continue
                code = _exit_code(ended)
            self.unreported.discard(pid)
            self._report(b"X %d %d\n" % (pid, code))
        # Ended workers stay until "done": the supervisor may still signal a worker whose end
        # it has not read yet, by pid or process group, which must not be anyone else's.
        workers = set(self.workers) if not self.done else set()
        live = False
        for pid in children_of_self():
            if pid not in workers:
                with suppress(ChildProcessError):
                    live |= os.waitpid(pid, os.WNOHANG)[0] == 0
        if self.done and not live:
            # Nothing of the run is left: below us everything descends from a live child of
            # ours, and there is none. Ending now, not when the supervisor closes its end,
            # keeps it from waiting while the kernel takes our copy of its memory apart.
            self._finish()

    def _finish(self) -> None:
        """After ``done``: reap the workers and any zombie, and exit."""
        for pid in [*self.workers, *children_of_self()]:
            with suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        os._exit(0)

    # --- the supervisor died -----------------------------------------------------------------

    def _supervisor_died(self) -> None:
        if self.kill_on_death:
            self.kill_everything()
            if self.remove_dir is not None:
                remove_tree(self.remove_dir)
        os._exit(0)

    def kill_everything(self) -> int:
        """SIGKILL every process of the run (see the module docstring) until none is left or
        ``kill_limit`` seconds passed, reaping all; returns how many kill signals were sent."""
        me = os.getpid()
        deadline = time.monotonic() + self.kill_limit
        pins: dict[int, int | None] = {}
        sent = 0
        try:
            while True:
                # Marked processes and forkserver workers' sessions may be anywhere.
                whole = self.marker is not None or self.forkserver_workers
                table = read_proc_table() if whole else read_subtree(me)
                found = find_run_processes(
                    table,
                    roots={me: None, **self.forkserver_workers},
                    pins=pins,
                    sessions=self.forkserver_workers,
                    marker=self.marker,
                    uid=self.uid,
                    since=self.started,
                    exclude=ancestors(me, table) | {me},
                )
                victims = {pid: pins[pid] for pid in found}
                for pid, fd in self.forkserver_workers.items():
                    if not has_exited(fd) and is_alive(table.get(pid)):
                        victims[pid] = fd
                for pid, fd in victims.items():
                    sent += send(pid, fd, signal.SIGKILL)
                has_children = _reap_all()
                if (not victims and not has_children) or time.monotonic() >= deadline:
                    return sent
                waiting = [fd for fd in victims.values() if fd is not None]
                if self.wake_r >= 0:
                    waiting.append(self.wake_r)
                _readable(waiting, min(0.05, max(0.0, deadline - time.monotonic())))
                if self.wake_r >= 0:
                    _drain(self.wake_r)
        finally:
            close_all(pins.values())


def _readable(fds: list[int], timeout: float | None) -> set[int]:
    """The fds of ``fds`` readable (or at end of file) within ``timeout`` seconds (None:
    until one is). ``poll``, not ``select``: a large run's fd numbers pass select's 1023."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    events = poller.poll(None if timeout is None else timeout * 1000.0)
    return {fd for fd, _ in events}


def _ignore(signum: int, frame: object) -> None:
    """SIGCHLD's handler: the C handler already wrote to the wakeup fd."""


def _drain(fd: int) -> None:
    with suppress(BlockingIOError, InterruptedError):
        while os.read(fd, 4096):
            pass


def _exit_code(ended: os.waitid_result) -> int:
    """Popen's convention for a ``waitid`` result: the status, or -N for signal N."""
    if ended.si_code == os.CLD_EXITED:
        return ended.si_status
    return -ended.si_status


def _reap_all() -> bool:
    """Reap every ended child; True while some child is left."""
    while True:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return False
        if pid == 0:
            return True


def remove_tree(path: str) -> None:
    """Remove the directory ``path`` and everything in it, never following a symbolic link;
    errors are ignored (what cannot be removed stays)."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                remove_tree(entry.path)
            else:
                os.unlink(entry.path)
        except OSError:
            pass
    with suppress(OSError):
        os.rmdir(path)


# --- the supervisor's end ------------------------------------------------------------------------


class Link:
    """The supervisor's end of the watchdog (module docstring): its pid, the command pipe, the
    status pipe. Made empty; :meth:`attach` once the watchdog is forked. All fds are tracked in
    the registry of :mod:`numarun.process.forkexec`."""

    def __init__(self) -> None:
        self.pid = 0  # the watchdog, our child until end() reaps it
        # Pins the watchdog: a caller that ignores SIGCHLD has the kernel reap it, and then
        # its pid is free for anyone.
        self.pidfd: int | None = None
        self.started: int | None = None  # its start time: no process of the run is older
        self.command_fd: int | None = None  # to the watchdog: "F ...", "done"
        self.status_fd: int | None = None  # from the watchdog: pids, execs, exits
        self.released = False  # "done" was written: the workers' pids are no longer held
        self._pending = b""  # read from status_fd, not yet taken as lines

    def attach(self, pid: int, command_fd: int, status_fd: int) -> None:
        """The watchdog ``pid`` was just forked (it cannot have been reaped yet: it ends only
        when told, or killed), with these pipes."""
        self.pid, self.command_fd, self.status_fd = pid, command_fd, status_fd
        with suppress(ProcessLookupError):
            self.pidfd = open_pidfd(pid)
            if self.pidfd is not None:
                forkexec.track(self.pidfd)
        self.started = start_time(pid)

    def line(self, deadline: float, wake_fd: int | None = None) -> bytes | None:
        """The next status line, blocking until ``deadline`` (a ``time.monotonic()``): None
        when it passed first, b"" at end of file, :data:`WOKEN` when ``wake_fd`` turned
        readable first (it is not read here). Only while the workers start: the loop reads
        the pipe afterwards (:meth:`read`)."""
        assert self.status_fd is not None
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            watched = [self.status_fd] if wake_fd is None else [self.status_fd, wake_fd]
            ready = _readable(watched, remaining)
            if wake_fd is not None and wake_fd in ready:
                return WOKEN
            if self.status_fd not in ready:
                continue
            try:
                data = os.read(self.status_fd, 4096)
            except BlockingIOError:
                continue
            if not data:
                return b""
            self._pending += data
        line, _, self._pending = self._pending.partition(b"\n")
        return line

    def hold(self, lines: list[bytes]) -> None:
        """Put ``lines``, read by :meth:`line` ahead of their time, back before the rest."""
        if lines:
            self._pending = b"\n".join(lines) + b"\n" + self._pending

    def read(self) -> bytes | None:
        """Read what the status pipe holds now (never blocks) and keep it for :meth:`exits`;
        returns it, b"" at end of file or on an error, None when there was nothing yet."""
        assert self.status_fd is not None
        try:
            data = os.read(self.status_fd, 4096)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        self._pending += data
        return data

    def ended(self, workers: Sequence[Worker]) -> list[Worker]:
        """The exec and fork workers of ``workers`` whose ``X`` line was read (:meth:`exits`),
        in that order, each with its code in ``Worker.reported``."""
        by_pid = {worker.pid: worker for worker in workers if worker.process is None}
        found = []
        for pid, code in self.exits():
            if pid in by_pid:
                by_pid[pid].reported = code
                found.append(by_pid[pid])
        return found

    def orphans(self, workers: Sequence[Worker]) -> list[Worker]:
        """After the watchdog ended, the exec and fork workers of ``workers`` whose end it never
        reported: it was killed by someone (it ends by itself only after ``done``, when every
        end is read). They got SIGKILL from the kernel (the parent-death signal), and are
        given that code; what they started went up to init, out of reach."""
        found = []
        for worker in workers:
            if worker.process is None and not worker.exited and worker.pid > 0:
                worker.reported = -signal.SIGKILL
                found.append(worker)
        return found

    def exits(self) -> list[tuple[int, int]]:
        """(pid, exit code) of each ``X`` line read so far and not yet taken; every complete
        line is taken."""
        *lines, self._pending = self._pending.split(b"\n")
        exits = []
        for line in lines:
            words = line.split()
            if len(words) == 3 and words[0] == b"X":
                exits.append((int(words[1]), int(words[2])))
        return exits

    def tell(self, line: bytes) -> None:
        """Write ``line`` to the watchdog; a watchdog that is gone is not told."""
        if self.command_fd is not None:
            with suppress(OSError):
                os.write(self.command_fd, line)

    def close_status(self) -> None:
        """The watchdog ended (end of file): close our end of the status pipe."""
        forkexec.close(self.status_fd)
        self.status_fd = None

    def abandon(self) -> None:
        """Close the command pipe without ``done``: the watchdog kills the run as if we had
        died (``kill_on_death``), then exits. For a start that cannot even read /proc."""
        self.released = True  # no "done" is written any more: the watchdog ends the run
        forkexec.close(self.command_fd)
        self.command_fd = None

    def release(self) -> None:
        """Tell the watchdog the run is over: it reaps the workers and exits, while we finish.
        From then on a worker's pid, group and session may be anyone's: nothing may be
        signalled by them, nor searched from them. Idempotent."""
        if not self.released:
            self.released = True
            self.tell(b"done\n")

    def end(self) -> None:
        """:meth:`release`, close both pipes and reap the watchdog, killing it after
        ``_END_WAIT`` seconds. Idempotent."""
        self.release()
        if self.command_fd is not None:
            forkexec.close(self.command_fd)
            self.command_fd = None
        if self.status_fd is not None:
            forkexec.close(self.status_fd)
            self.status_fd = None
        pid, self.pid = self.pid, 0
        if pid:
            _reap_bounded(pid, self.pidfd, _END_WAIT)
        forkexec.close(self.pidfd)
        self.pidfd = None


def _reap_bounded(pid: int, pidfd: int | None, limit: float) -> None:
    """Reap our child ``pid`` (pinned by ``pidfd``, where pidfds work) within ``limit``
    seconds; SIGKILL it then and wait up to ``limit`` more. One still not reaped (stuck in the
    kernel, in uninterruptible sleep) is left to a daemon thread that reaps it when it ends:
    the caller never waits longer than twice ``limit``."""
    if _reaped_within(pid, pidfd, limit):
        return
    send(pid, pidfd, signal.SIGKILL)  # by pid only while unreaped: our child holds it
    if _reaped_within(pid, pidfd, limit):
        return
    import threading

    threading.Thread(target=_reap, args=(pid,), name="numarun-reap", daemon=True).start()


def _reaped_within(pid: int, pidfd: int | None, limit: float) -> bool:
    """Whether our child ``pid`` has been reaped (here, or by anyone: then True as well)
    within ``limit`` seconds."""
    deadline = time.monotonic() + limit
    while True:
        try:
            if os.waitpid(pid, os.WNOHANG)[0] != 0:
                return True
        except ChildProcessError:
            return True  # reaped by a caller's waitpid(-1), or by the kernel (SIGCHLD ignored)
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if pidfd is not None:
            readable(pidfd, left)
        else:
            time.sleep(min(FALLBACK_TICK, left))


def _reap(pid: int) -> None:
    with suppress(ChildProcessError):
        os.waitpid(pid, 0)


if __name__ == "__main__":
    sys.exit("numarun.process.watchdog is started by numarun's supervisor, not run by hand")
