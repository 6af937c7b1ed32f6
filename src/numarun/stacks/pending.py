"""A job that waits in its rendezvous, as ``numarun stacks`` finds it: no ranks yet, so no socket.

A launcher's socket (:class:`numarun.stacks.channel.JobServer`) is served from the supervisor's
loop, which runs only while workers run; before its first round (and between rounds) the
launcher waits in torch's rendezvous, where nothing serves it. So, while it waits, it keeps a
small status record beside the sockets, ``<runtime dir>/<pid>-<random>.wait`` (0600, in the
same private directory, written whole and renamed into place): the run id, its pid and that
process's start time, the host, the command, and the wait (:mod:`numarun.rendezvous.waiting`:
where, since when, what this node is doing, who is there, how many more are awaited), rewritten
when it changes and removed when the round formed. Writing it never blocks the launcher's wait
for long (a small file in a private directory) and never ends the launch: a failure drops it.

The client (:func:`pending_jobs`) reads each record as untrusted data (a regular file of the
user's, at most :data:`RECORD_LIMIT` bytes, every field checked) and keeps it only while its
launcher runs (the pid's start time matches): a record a killed launcher left is removed.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

RECORD_LIMIT = 16384  # bytes of one record
SUFFIX = ".wait"


def _start_time(pid: int) -> int | None:
    """The start time of process ``pid`` (clock ticks since boot), None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            data = file.read()
        return int(data[data.rindex(b")") + 2 :].split()[19])
    except (OSError, ValueError, IndexError):
        return None


class PendingRecord:
    """This launcher's status record while it waits in the rendezvous: :meth:`update` with the
    wait's status (None: the wait is over, the record removed), :meth:`remove` at the end.
    ``describe``: the job's fixed fields (``run_id``, ``host``, ``entrypoint``, ...)."""

    def __init__(self, directory: str, describe: Mapping[str, object]) -> None:
        self.path = os.path.join(directory, f"{os.getpid()}-{os.urandom(4).hex()}{SUFFIX}")
        self._fixed = {**describe, "pid": os.getpid(), "proc_start": _start_time(os.getpid()),
                       "started": time.time()}  # fmt: skip

    def update(self, status: dict | None) -> None:
        """Write the record with ``status`` (the rendezvous wait's), or remove it for None.
        Raises OSError (the caller drops the record)."""
        import json

        if status is None:
            self.remove()
            return
        data = json.dumps({**self._fixed, "waiting": status}).encode()[:RECORD_LIMIT]
        temporary = self.path + ".tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        os.rename(temporary, self.path)

    def remove(self) -> None:
        for path in (self.path, self.path + ".tmp"):
            with contextlib.suppress(OSError):
                os.unlink(path)


def read_record(path: str) -> dict | None:
    """The record at ``path`` while its launcher runs, checked; None for one that is not a
    record (or not the user's: skipped) and for a stale one (removed)."""
    import json

    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
            return None
        data = os.read(fd, RECORD_LIMIT + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        record = json.loads(data) if len(data) <= RECORD_LIMIT else None
    except ValueError:
        record = None
    if not _checked(record):
        return None
    assert isinstance(record, dict)
    if _start_time(record["pid"]) != record["proc_start"]:  # its launcher is gone
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    return record


def _checked(record: object) -> bool:
    """Whether ``record`` has the fields the client shows, each of its type."""
    if not isinstance(record, dict):
        return False
    waiting = record.get("waiting")
    return (
        isinstance(record.get("pid"), int)
        and record["pid"] > 0
        and isinstance(record.get("proc_start"), int)
        and isinstance(record.get("started"), int | float)
        and isinstance(waiting, dict)
        and isinstance(waiting.get("since"), int | float)
        and all(isinstance(waiting.get(key), str) for key in ("where", "doing", "wanted"))
        and isinstance(waiting.get("text", ""), str)
    )


def waiting_line(record: Mapping, now: float | None = None) -> str:
    """What ``numarun stacks`` says of a waiting job: that it has no ranks yet, where it waits,
    since when, and for whom (escaped, bounded)."""
    from numarun.stacks.digest import printable

    waiting = record["waiting"]
    now = time.time() if now is None else now
    since = time.strftime("%H:%M:%S", time.localtime(waiting["since"]))
    waited = max(0, round(now - waiting["since"]))
    text = printable(str(waiting.get("text") or f"this node is {waiting['doing']}"))[:600]
    return printable(
        f"numarun stacks: job {str(record.get('run_id'))[:200]} (launcher pid {record['pid']} "
        f"on {str(record.get('host'))[:200]}) has no ranks yet: it waits in the "
        f"{waiting['where'][:400]} since {since} ({waited} s): {text}"
    )
