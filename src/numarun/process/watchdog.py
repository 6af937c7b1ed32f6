"""The watchdog: parent of a run's workers, reaper of everything they leave, and their killer if
the supervisor dies; and the /proc reading and pid pinning both it and the supervisor use to find
a run's processes without ever signalling another.

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
  N). The watchdog keeps ended workers as zombies (``waitid(WNOWAIT)``), so that a worker's
  pid, and with it its process group and session id, cannot be reused while the run lasts;
  orphans adopted from the run are reaped at once.

The watchdog exits (end of file on the status pipe) once every worker has ended and it has no
live child left (in a run without forkserver workers): every process of the run descends from
a live child of the watchdog, so then none is left, and none can appear.

Supervisor to watchdog (the command pipe): ``F <pid> <start time>`` names a ``"forkserver"``
worker (a child of multiprocessing's fork server, not of the watchdog), which the watchdog pins
with a pidfd if that pid still has that start time (``/proc/<pid>/stat``, field 22). ``done``
means the run is over and swept: the watchdog reaps the workers and exits 0. End of file
without ``done`` means the supervisor died (even by SIGKILL: the kernel closes its end). The
watchdog then SIGKILLs every descendant of its own until it has no children left or
``kill_limit`` seconds passed; in a run with forkserver workers also those workers, their
descendants, the processes in their sessions while they hold their pid, and every process of
the supervisor's real uid whose ``/proc/<pid>/environ`` holds ``NUMARUN_RUN_ID=<run id>``;
removes ``remove_dir`` if given; then exits 0. Its workers, whose parent it is, get no
parent-death signal while it lives, so it finds their trees intact.

The watchdog runs in its own process group (``kill -9 -PGID`` of the supervisor's group, as a
shell's job control sends, spares it) and ignores SIGINT, SIGTERM, SIGHUP and SIGQUIT. If it is
itself killed, the workers get SIGKILL from the kernel (``PR_SET_PDEATHSIG``, set in each
worker) and their descendants are adopted by whatever is above it: the one case where numarun
loses track of a run's processes. It shares its memory pages with the supervisor's process
(copy-on-write): they count in its resident size as ``ps`` shows it, not twice in the machine's
memory.

Pinning: a pid read from /proc may belong to another process by the time it is signalled, if
the first one exited and was reaped meanwhile. :func:`find_run_processes` therefore opens a
pidfd on each candidate first and only then checks, on the process the pidfd refers to, why it
belongs to the run; signals then go through the pidfd (:func:`send`). Where pidfds do not work
(Linux before 5.3), candidates are checked and signalled by pid.
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal
import sys
import time
from collections.abc import Iterable, Mapping

EXEC_LIMIT = 60.0  # seconds from fork to exec before a worker is reported "late"

# (ppid, pgid, sid, state letter) of one process, from /proc/<pid>/stat.
ProcInfo = tuple[int, int, int, str]

_pidfds_work = hasattr(os, "pidfd_open")
_children_files = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


# --- /proc ---------------------------------------------------------------------------------------


def read_proc_table(proc: str = "/proc") -> dict[int, ProcInfo]:
    """Every process now in ``proc``: pid -> (ppid, pgid, sid, state letter).

    Processes that vanish while the table is read are left out; never raises for them.
    """
    table: dict[int, ProcInfo] = {}
    for name in os.listdir(proc):
        if not name.isdigit():
            continue
        info = read_proc_stat(int(name), proc)
        if info is not None:
            table[int(name)] = info
    return table


def read_proc_stat(pid: int, proc: str = "/proc") -> ProcInfo | None:
    """(ppid, pgid, sid, state letter) of ``pid``; None when it does not exist (any more)."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name is in parentheses and may itself hold ')' and spaces.
    fields = text[text.rfind(b")") + 2 :].split()
    if len(fields) < 4:
        return None
    return int(fields[1]), int(fields[2]), int(fields[3]), fields[0].decode("ascii", "replace")


def start_time(pid: int, proc: str = "/proc") -> int | None:
    """When ``pid`` started, in clock ticks since boot (``/proc/<pid>/stat`` field 22); with
    the pid it names one process for good. None when it does not exist."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as stat:
            text = stat.read()
        return int(text[text.rfind(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


def real_uid(pid: int, proc: str = "/proc") -> int | None:
    """The real uid of ``pid`` (``Uid:`` in ``/proc/<pid>/status``); None when unreadable."""
    try:
        with open(f"{proc}/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"Uid:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


def environ_has(pid: int, marker: bytes, proc: str = "/proc") -> bool:
    """Whether ``marker`` (``NAME=value``) is one entry of ``pid``'s initial environment.

    ``/proc/<pid>/environ`` shows the environment the process was exec'd with (forked children
    share it); False when unreadable (another user's process, a zombie, gone).
    """
    try:
        with open(f"{proc}/{pid}/environ", "rb") as environ:
            data = environ.read()
    except OSError:
        return False
    return data.startswith(marker + b"\0") or (b"\0" + marker + b"\0") in data or data == marker


def ancestors(pid: int, table: Mapping[int, ProcInfo]) -> set[int]:
    """``pid``'s parent, grandparent, ... up to the root, as found in ``table``."""
    found: set[int] = set()
    current = table[pid][0] if pid in table else 0
    while current > 0 and current not in found:
        found.add(current)
        current = table[current][0] if current in table else 0
    return found


def is_alive(info: ProcInfo | None) -> bool:
    """Whether a process with this /proc state can still run (not gone, zombie or dead)."""
    return info is not None and info[3] not in "ZXx"


def children_of_self() -> list[int]:
    """The calling process's children (its main thread's; the watchdog has no other)."""
    me = os.getpid()
    try:
        with open(f"/proc/{me}/task/{me}/children", "rb") as listing:
            return [int(pid) for pid in listing.read().split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN
        return [pid for pid, info in read_proc_table().items() if info[0] == me]


def read_subtree(root: int, proc: str = "/proc") -> dict[int, ProcInfo]:
    """``root`` and the processes below it, as :func:`read_proc_table` gives them, found
    through each thread's ``/proc/<pid>/task/<tid>/children``: the cost follows the size of the
    run, not the machine's. The whole table where the kernel has no such files
    (``CONFIG_PROC_CHILDREN``)."""
    if not _children_files:
        return read_proc_table(proc)
    table: dict[int, ProcInfo] = {}
    queue = [root]
    while queue:
        pid = queue.pop()
        info = read_proc_stat(pid, proc)
        if info is None or pid in table:
            continue
        table[pid] = info
        try:
            threads = os.listdir(f"{proc}/{pid}/task")
        except OSError:
            continue
        for tid in threads:
            try:
                with open(f"{proc}/{pid}/task/{tid}/children", "rb") as listing:
                    queue.extend(int(child) for child in listing.read().split())
            except OSError:
                pass  # the thread ended meanwhile
    return table


# --- pidfds --------------------------------------------------------------------------------------


def open_pidfd(pid: int) -> int | None:
    """A pidfd (close-on-exec) for ``pid``; None where pidfds do not work or no fd is left.

    Raises ProcessLookupError when ``pid`` does not exist.
    """
    global _pidfds_work
    if not _pidfds_work:
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSYS, errno.EPERM):
            _pidfds_work = False
        return None  # EMFILE and the like: this one process is checked by pid


def has_exited(fd: int | None) -> bool:
    """Whether the process behind pidfd ``fd`` has exited (zombie or reaped); False for None."""
    if fd is None:
        return False
    ready, _, _ = select.select([fd], [], [], 0)
    return bool(ready)


def is_held(fd: int | None) -> bool:
    """Whether the process behind pidfd ``fd`` still holds its pid (alive or an unreaped
    zombie), so that the pid, and a session or group of that number, cannot be reused."""
    if fd is None:
        return True
    try:
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # EPERM: it exists
    return True


def send(pid: int, fd: int | None, signum: int) -> bool:
    """Send ``signum`` to the process behind pidfd ``fd`` (by pid when ``fd`` is None); False
    when it no longer exists."""
    try:
        if fd is not None:
            signal.pidfd_send_signal(fd, signum)
        else:
            os.kill(pid, signum)
    except ProcessLookupError:
        return False
    return True


def close_all(fds: Iterable[int | None]) -> None:
    for fd in fds:
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


# --- finding a run's processes -------------------------------------------------------------------


def find_run_processes(
    table: Mapping[int, ProcInfo],
    *,
    roots: Mapping[int, int | None],
    pins: dict[int, int | None],
    sessions: Mapping[int, int | None] | None = None,
    marker: bytes | None = None,
    uid: int | None = None,
    exclude: Iterable[int] = (),
    proc: str = "/proc",
) -> dict[int, ProcInfo]:
    """The live processes of a run in ``table``, each pinned and checked after pinning.

    A process belongs to the run when its parent is one of ``roots`` or another process found
    here; when its session id is a key of ``sessions`` whose process still holds its pid; or,
    with ``marker`` (``NUMARUN_RUN_ID=...``), when its environment holds the marker and its
    real uid is ``uid``: a marker can be copied into any process, so another user's never
    counts. ``roots`` and ``sessions`` map a pid to a pidfd for it, or to None for a pid that
    cannot be reused while this runs (a child or held zombie of the caller's); roots themselves
    are never returned. Pids in ``exclude`` are never returned or searched through.

    ``pins`` maps pids already found to their pidfds (None: no pidfd). New finds are added;
    the caller closes them. A pinned process is re-read through /proc after its pidfd was
    opened and kept only if it still belongs, and if the parent or session holder it was found
    through was still there after that read, so a pid reused meanwhile is never returned.
    Zombies and processes that exited are left out. Returns pid -> its /proc/<pid>/stat info.
    """
    excluded = set(exclude)
    held_sessions = {sid: fd for sid, fd in (sessions or {}).items()}
    by_parent: dict[int, list[int]] = {}
    for pid, info in table.items():
        by_parent.setdefault(info[0], []).append(pid)
    found: dict[int, ProcInfo] = {}
    queue = [(child, parent) for parent in roots for child in by_parent.get(parent, ())]
    for pid, info in table.items():
        if pid in excluded or pid in roots or not is_alive(info):
            continue
        if info[2] in held_sessions or (
            marker is not None and environ_has(pid, marker, proc) and real_uid(pid, proc) == uid
        ):
            queue.append((pid, 0))
    while queue:
        pid, parent = queue.pop()
        if pid in found or pid in excluded or pid in roots or not is_alive(table.get(pid)):
            continue
        info = _pin(pid, parent, roots, pins, held_sessions, marker, uid, proc)
        if info is not None:
            found[pid] = info
            queue.extend((child, pid) for child in by_parent.get(pid, ()))
    return found


def _pin(
    pid: int,
    parent: int,
    roots: Mapping[int, int | None],
    pins: dict[int, int | None],
    sessions: Mapping[int, int | None],
    marker: bytes | None,
    uid: int | None,
    proc: str,
) -> ProcInfo | None:
    """``pid``'s /proc info if, pinned, it belongs (see :func:`find_run_processes`), else None.
    ``parent`` is the process it was found through, 0 for a session or marker match."""
    if pid in pins:  # found before: it stays the run's as long as it lives
        if has_exited(pins[pid]):
            return None
        return read_proc_stat(pid, proc)
    try:
        fd = open_pidfd(pid)
    except ProcessLookupError:
        return None
    info = read_proc_stat(pid, proc)
    belongs = False
    if info is not None and is_alive(info):
        if parent:
            through = roots[parent] if parent in roots else pins.get(parent)
            belongs = info[0] == parent and not has_exited(through)
        elif info[2] in sessions:
            belongs = is_held(sessions[info[2]])
        else:
            belongs = (
                marker is not None and environ_has(pid, marker, proc) and real_uid(pid, proc) == uid
            )
    if not belongs or has_exited(fd):
        close_all([fd])
        return None
    pins[pid] = fd
    return info


# --- the watchdog process ------------------------------------------------------------------------


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
            ready, _, _ = select.select(watched, [], [], timeout)
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
                    self._supervisor_died()

    # --- while the run goes on ---------------------------------------------------------------

    def _obey(self, line: bytes) -> None:
        words = line.split()
        if words == [b"done"]:
            self._finish()
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
        with contextlib.suppress(OSError):
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
        workers = set(self.workers)
        live = False
        for pid in children_of_self():
            if pid not in workers:
                with contextlib.suppress(ChildProcessError):
                    live |= os.waitpid(pid, os.WNOHANG)[0] == 0
        if not (live or self.unreported or self.checks or self.forkserver_workers or self.marker):
            # Nothing of the run is left: below us everything descends from a live child of
            # ours, and there is none. Ending now, not at "done", keeps the supervisor from
            # waiting while the kernel takes our copy of its memory apart.
            self._finish()

    def _finish(self) -> None:
        """``done``, or nothing of the run left: reap the workers and any zombie, and exit."""
        for pid in [*self.workers, *children_of_self()]:
            with contextlib.suppress(ChildProcessError):
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
                    exclude=ancestors(me, table) | {me},
                )
                victims = {pid: pins[pid] for pid in found}
                for pid, fd in self.forkserver_workers.items():
                    if not has_exited(fd) and is_alive(table.get(pid)):
                        victims[pid] = fd
                for pid, fd in victims.items():
                    sent += send(pid, fd, signal.SIGKILL)
                children = _reap_all()
                if (not victims and not children) or time.monotonic() >= deadline:
                    return sent
                waiting = [fd for fd in victims.values() if fd is not None]
                if self.wake_r >= 0:
                    waiting.append(self.wake_r)
                select.select(waiting, [], [], min(0.05, max(0.0, deadline - time.monotonic())))
                if self.wake_r >= 0:
                    _drain(self.wake_r)
        finally:
            close_all(pins.values())


def _ignore(signum: int, frame: object) -> None:
    """SIGCHLD's handler: the C handler already wrote to the wakeup fd."""


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError, InterruptedError):
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
    with contextlib.suppress(OSError):
        os.rmdir(path)


if __name__ == "__main__":
    sys.exit("numarun.process.watchdog is started by numarun's supervisor, not run by hand")
