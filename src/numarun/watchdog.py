"""Finding a run's processes in /proc, and the watchdog that kills them if the supervisor dies.

The watchdog is a small process the supervisor starts with :func:`watchdog_argv`, in the
supervisor's own session and process group. Normally it is the POSIX shell script
:data:`WATCHDOG_SH` (``/bin/sh`` starts in about a millisecond, where a Python interpreter costs
tens of milliseconds of CPU that would compete with the workers starting at the same time); it
needs ``grep -z`` (GNU or BusyBox) for the environment check. Without ``/bin/sh`` this file
runs as a script instead, ``python -I -S watchdog.py RUN_ID``, importing only the standard
library. Both behave the same. The functions below also serve the supervisor's own sweeps.

Protocol on the watchdog's stdin (a pipe whose only writer is the supervisor), ASCII lines:

* ``<pid>`` announces a worker. Workers call ``setsid()``, so their session id is their pid.
* ``done`` means the supervisor finished and swept the run itself: the watchdog exits 0 at once.

End of file without ``done`` means the supervisor died (even by SIGKILL: the kernel closes its
end of the pipe). The watchdog then SIGKILLs every process, other than itself and its
ancestors, whose session id is an announced worker pid or whose ``/proc/<pid>/environ`` holds
``NUMARUN_RUN_ID=RUN_ID``; it sweeps again until a sweep finds nobody alive, for about one
second at most (the Python version waits on pidfds between sweeps, the shell version 50 ms);
then it exits 0. The workers themselves
die by their parent-death signal; this catches their descendants, which that signal misses.

SIGINT, SIGTERM and SIGHUP are ignored: Ctrl-C at a terminal signals the supervisor's whole
process group, this process included, and the watchdog must outlive the supervisor.

Limit: a descendant that both left the workers' sessions (``setsid``) and never exec'd from a
worker that was itself exec'd with the marker (for example one forked by a worker started with
``start="fork"``) carries no marker in ``/proc/<pid>/environ``, so only the supervisor, while
alive, can find it (through parent links).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import time

RUN_ID_ENV = "NUMARUN_RUN_ID"
SWEEP_LIMIT = 1.0  # seconds the watchdog spends killing before it gives up

# $1: the run id. Reads worker pids (or "done") on stdin; see the module docstring.
WATCHDOG_SH = r"""
trap '' INT TERM HUP
set -f
marker="NUMARUN_RUN_ID=$1"
me=$$
sessions=" "
while IFS= read -r line; do
    case $line in
        done) exit 0 ;;
        ''|*[!0-9]*) ;;
        *) sessions="$sessions$line " ;;
    esac
done
sweep() {
    found=
    set +f
    files=$(grep -lzxF -e "$marker" /proc/[0-9]*/environ 2>/dev/null)
    dirs=$(echo /proc/[0-9]*)
    set -f
    for file in $files; do
        pid=${file#/proc/}
        pid=${pid%/environ}
        if [ "$pid" != "$me" ] && kill -9 "$pid" 2>/dev/null; then found=1; fi
    done
    for dir in $dirs; do
        pid=${dir#/proc/}
        { read -r stat < "$dir/stat"; } 2>/dev/null || continue
        set -- ${stat##*) }
        case $1 in Z|X|x) continue ;; esac
        case $sessions in
            *" $4 "*)
                if [ "$pid" != "$me" ] && kill -9 "$pid" 2>/dev/null; then found=1; fi ;;
        esac
    done
}
round=0
while [ $round -lt 20 ]; do
    round=$((round + 1))
    sweep
    [ -z "$found" ] && exit 0
    sleep 0.05
done
exit 0
"""


def watchdog_argv(run_id: str) -> list[str]:
    """The command that starts the watchdog for ``run_id`` (shell, or Python without /bin/sh)."""
    if os.access("/bin/sh", os.X_OK):
        return ["/bin/sh", "-c", WATCHDOG_SH, "numarun-watchdog", run_id]
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), run_id]


# (ppid, pgid, sid, state letter) of one process, from /proc/<pid>/stat.
ProcInfo = tuple[int, int, int, str]


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


def ancestors(pid: int, table: dict[int, ProcInfo]) -> set[int]:
    """``pid``'s parent, grandparent, ... up to the root, as found in ``table``."""
    found: set[int] = set()
    current = table[pid][0] if pid in table else 0
    while current > 0 and current not in found:
        found.add(current)
        current = table[current][0] if current in table else 0
    return found


def find_run_processes(
    table: dict[int, ProcInfo],
    *,
    roots: set[int],
    sessions: set[int],
    marker: bytes | None,
    exclude: set[int],
    proc: str = "/proc",
) -> set[int]:
    """Pids in ``table`` that belong to a run, zombies included.

    A process belongs when it is one of ``roots`` or a descendant of one (parent links), when
    its session id is in ``sessions`` (sessions outlive reparenting), when its environment
    holds ``marker`` (survives ``setsid``), or when it descends from such a process. Pids in
    ``exclude`` are never returned and never searched through.
    """
    children: dict[int, list[int]] = {}
    for pid, (ppid, _pgid, _sid, _state) in table.items():
        children.setdefault(ppid, []).append(pid)
    seeds = [pid for pid in roots if pid in table]
    for pid, (_ppid, _pgid, sid, state) in table.items():
        if pid in exclude:
            continue
        if sid in sessions or (marker and state not in "ZX" and environ_has(pid, marker, proc)):
            seeds.append(pid)
    found: set[int] = set()
    while seeds:
        pid = seeds.pop()
        if pid in found or pid in exclude:
            continue
        found.add(pid)
        seeds.extend(children.get(pid, ()))
    return found


def is_alive(info: ProcInfo | None) -> bool:
    """Whether a process with this /proc state can still run (not gone, zombie or dead)."""
    return info is not None and info[3] not in "ZXx"


def kill_run(run_id: str, sessions: set[int], limit: float = SWEEP_LIMIT) -> int:
    """SIGKILL the run's processes (see the module docstring) until none is alive or ``limit``
    seconds passed; returns how many kill signals were sent. Waits on pidfds, never sleeps."""
    marker = f"{RUN_ID_ENV}={run_id}".encode()
    me = os.getpid()
    deadline = time.monotonic() + limit
    sent = 0
    while True:
        table = read_proc_table()
        exclude = ancestors(me, table) | {me}
        victims = [
            pid
            for pid in find_run_processes(
                table, roots=set(), sessions=sessions, marker=marker, exclude=exclude
            )
            if is_alive(table.get(pid))
        ]
        if not victims:
            return sent
        pidfds: list[int] = []
        for pid in victims:
            with contextlib.suppress(OSError, AttributeError):
                pidfds.append(os.pidfd_open(pid))
            try:
                os.kill(pid, signal.SIGKILL)
                sent += 1
            except OSError:
                pass
        try:
            _wait_readable(pidfds, deadline)
        finally:
            for fd in pidfds:
                os.close(fd)
        if time.monotonic() >= deadline:
            return sent


def _wait_readable(fds: list[int], deadline: float) -> None:
    """Block until every fd in ``fds`` is readable (a pidfd: its process exited) or deadline."""
    pending = list(fds)
    while pending:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        ready, _, _ = select.select(pending, [], [], remaining)
        pending = [fd for fd in pending if fd not in ready]


def main(argv: list[str]) -> int:
    """Watchdog entry: ``argv`` is ``[RUN_ID]``; reads stdin as described above; exits 0."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    if len(argv) != 1:
        sys.stderr.write("usage: watchdog.py RUN_ID (started by numarun's supervisor)\n")
        return 2
    sessions: set[int] = set()
    pending = b""
    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            break
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line == b"done":
                return 0
            if line.strip().isdigit():
                sessions.add(int(line))
    kill_run(argv[0], sessions)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
