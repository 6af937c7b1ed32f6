"""What a run's processes are, read from ``/proc``, and pidfds that pin them.

Used by the watchdog (:mod:`numarun.process.watchdog`), in the process the supervisor forked,
and by the supervisor (:mod:`numarun.process.supervisor`) to find what it tears down. Only plain
``os``, ``select`` and ``signal`` calls and files opened per call: the forked watchdog may call
all of it, whatever locks another thread of the caller held at fork time.

The process table: :func:`read_proc_table` reads every ``/proc/<pid>/stat`` (what a run with
``"forkserver"`` workers needs: marked processes and sessions may be anywhere);
:func:`read_subtree` reads only a process and those below it, through each thread's
``/proc/<pid>/task/<tid>/children`` (the cost follows the size of the run, not the machine's).
Processes that vanish while either reads are left out; neither raises for them, but both
raise OSError when the caller is out of fds (EMFILE, ENFILE): a process must never look gone
because it could not be read.

Pinning: a pid read from /proc may belong to another process by the time it is signalled, if
the first one exited and was reaped meanwhile. :func:`find_run_processes` therefore opens a
pidfd on each candidate first and only then checks, on the process the pidfd refers to, why it
belongs to the run; signals then go through the pidfd (:func:`send`). Where pidfds do not work
(Linux before 5.3), candidates are checked and signalled by pid, and whoever waits for them
checks every :data:`FALLBACK_TICK` seconds.
"""

from __future__ import annotations

import _signal as signal  # not signal.py, whose enums cost a launch ~2 ms (DESIGN.md)
import errno
import os
import select

from numarun.errors import suppress

TYPE_CHECKING = False  # typing is not imported at run time (machine/model.py)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

FALLBACK_TICK = 0.05  # seconds between checks of a process that has no pidfd
_NO_FD = (errno.EMFILE, errno.ENFILE)  # out of fds: a read failed, not a process gone

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
    """(ppid, pgid, sid, state letter) of ``pid``; None when it does not exist (any more).
    Out of fds (EMFILE, ENFILE) raises: a process must not look gone for want of an fd."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError as exc:
        if exc.errno in _NO_FD:
            raise
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


def carries_marker(
    pid: int,
    info: ProcInfo,
    marker: bytes,
    uid: int | None,
    since: int | None = None,
    proc: str = "/proc",
) -> bool:
    """Whether ``pid`` (``info``: its /proc stat) is a process of real uid ``uid``, started at
    or after ``since`` (when given), whose initial environment holds ``marker``.

    The cheap checks come first, and a process in uninterruptible sleep (``D``) is never
    looked at: reading ``/proc/<pid>/environ`` takes that process's memory-map lock, and blocks
    in the kernel, unkillably, behind one of its threads stuck in the kernel with it held. What
    the environment is read of is then only this user's processes started since the run.
    """
    if info[3] == "D" or real_uid(pid, proc) != uid:
        return False
    if since is not None:
        started = start_time(pid, proc)
        if started is None or started < since:
            return False
    return environ_has(pid, marker, proc)


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
        except OSError as exc:
            if exc.errno in _NO_FD:
                raise
            continue
        for tid in threads:
            try:
                with open(f"{proc}/{pid}/task/{tid}/children", "rb") as listing:
                    queue.extend(int(child) for child in listing.read().split())
            except OSError as exc:
                if exc.errno in _NO_FD:
                    raise
                # the thread ended meanwhile
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


def readable(fd: int, timeout: float = 0.0) -> bool:
    """Whether ``fd`` is readable (a pidfd: its process exited; a pipe: data or end of file)
    within ``timeout`` seconds. ``poll``, not ``select``: a run of a thousand workers holds fd
    numbers above ``select``'s limit (1023)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(max(0.0, timeout) * 1000.0))


def has_exited(fd: int | None) -> bool:
    """Whether the process behind pidfd ``fd`` has exited (zombie or reaped); False for None."""
    if fd is None:
        return False
    return readable(fd)


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
            with suppress(OSError):
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
    since: int | None = None,
    exclude: Iterable[int] = (),
    proc: str = "/proc",
) -> dict[int, ProcInfo]:
    """The live processes of a run in ``table``, each pinned and checked after pinning.

    A process belongs to the run when its parent is one of ``roots`` or another process found
    here; when its session id is a key of ``sessions`` whose process still holds its pid; or,
    with ``marker`` (``NUMARUN_RUN_ID=...``), when its environment holds the marker and its
    real uid is ``uid``: a marker can be copied into any process, so another user's never
    counts; with ``since`` (clock ticks since boot, as :func:`start_time`), only processes
    started at or after it are looked at for the marker (:func:`carries_marker`: a process in
    uninterruptible sleep is never read). ``roots`` and ``sessions`` map a pid to a pidfd for
    it, or to None for a pid that cannot be reused while this runs (a child or held zombie of
    the caller's); roots themselves are never returned. Pids in ``exclude`` are never returned
    or searched through.

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
            marker is not None and carries_marker(pid, info, marker, uid, since, proc)
        ):
            queue.append((pid, 0))
    while queue:
        pid, parent = queue.pop()
        if pid in found or pid in excluded or pid in roots or not is_alive(table.get(pid)):
            continue
        info = _pin(pid, parent, roots, pins, held_sessions, marker, uid, since, proc)
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
    since: int | None,
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
        else:
            # A session whose holder is gone proves nothing, but the marker still may: a
            # forkserver worker's child that outlived it keeps the worker's session id.
            belongs = (info[2] in sessions and is_held(sessions[info[2]])) or (
                marker is not None and carries_marker(pid, info, marker, uid, since, proc)
            )
    if not belongs or has_exited(fd):
        close_all([fd])
        return None
    pins[pid] = fd
    return info
