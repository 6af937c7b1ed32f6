"""The launcher's side of each rank's helper thread (:mod:`numarun.worker.dumphandler`): stacks
and flight recorder asked for through a FIFO and read back, and, only when the helper cannot get
the GIL, the stack signal sent to the rank's main thread.

Files, beside each rank's dump file ``rank<N>`` in the job's private 0700 directory, made here
before the rank starts (0600; the rank opens them, never creates them): ``rank<N>.req``, a FIFO
the launcher writes request lines to (``<number> <what>``: ``s`` stacks, ``f`` flight
recorder; opened read-write and non-blocking here, so a write never waits for the rank, and a
rank that never reads costs at most the FIFO's buffer); ``rank<N>.fr``, the helper's answers
(its thread id first, then flight recorders); ``rank<N>.sig``, what the signal handler writes
when the launcher had to signal. The helper writes its stacks to ``rank<N>`` itself, after a
line ``numarun-stacks <number>``.

Which dump answers a request (:meth:`RankHelpers.stacks_dump`): the helper's, after the last
``numarun-stacks`` line, when that line names the request; else, once the rank was signalled
for it, what the handler wrote to ``rank<N>.sig``. The helper's dump needs the GIL: it comes
within milliseconds in a rank blocked in C (a collective, a store, a sleep: the GIL is free)
and within the switch interval (5 ms, more on a loaded machine: 0.7 s was seen at load 5 on 2
cores) in one running Python. When it has not come :data:`NUDGE_AFTER` seconds after the
request while the helper thread sleeps (state ``S`` in ``/proc``: it waits for the GIL),
:meth:`RankHelpers.should_nudge` says to signal the rank's main thread, the thread most likely
holding the GIL (in C code that keeps it, or running Python on a machine too busy to hand it
over): the handler, running on the thread it interrupts, dumps every thread as numarun did
before the helper existed. Not the helper: a dump taken on a thread that does not hold the GIL
reads the frames of the one that does while it changes them, and killed a rank deep in
recursion at the first try (SIGSEGV). A helper that is runnable (starved of CPU) is never
signalled: its answer comes later, or the rank is unknown.

Everything read back is the user's process's: an answer is read at most
:data:`~numarun.worker.dumphandler.FLIGHT_LIMIT` bytes (plus its header), and a header that
does not parse is no answer. Never parsed here: :mod:`numarun.stacks.flight` reads the flight
recorder, :mod:`numarun.stacks.parse` the stacks.
"""

from __future__ import annotations

import os
import time

from numarun.process import forkexec
from numarun.worker.dumphandler import (
    ANSWER_MAGIC,
    ANSWER_SUFFIX,
    FLIGHT_LIMIT,
    REQUEST_SUFFIX,
    SIGNAL_SUFFIX,
    STACKS_MAGIC,
)

TYPE_CHECKING = False  # typing is not imported at run time (machine/model.py)
if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

NUDGE_AFTER = 0.5  # seconds without the helper's stacks before the rank is signalled
STATUSES = ("ok", "none", "absent", "error")
_HEADER_LIMIT = 128  # bytes of an answer's header line, at most
_MAX_DUMP = 4 * 1024 * 1024  # bytes of a stack dump read (faulthandler's stay far below)
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class FlightAnswer:
    """One rank's flight recorder as the launcher got it: ``status`` ``"ok"`` (``data`` is
    torch's dump, unparsed), ``"none"`` (the rank has no collectives to record: ``reason``
    says why, in its own words: ``torch.distributed not imported``, ...), ``"absent"`` (its
    torch has no recorder for its backend: ``reason``), ``"error"`` (taking it raised:
    ``reason``), or ``"unanswered"`` (no answer in time, or the rank cannot be asked:
    ``reason``)."""

    __slots__ = ("data", "local_rank", "rank", "reason", "status")

    def __init__(
        self, rank: int, local_rank: int, status: str, data: bytes = b"", reason: str = ""
    ) -> None:
        self.rank = rank
        self.local_rank = local_rank
        self.status = status
        self.data = data
        self.reason = reason

    def __repr__(self) -> str:
        return (f"FlightAnswer(rank={self.rank}, status={self.status!r}, "
                f"{len(self.data)} bytes, reason={self.reason!r})")  # fmt: skip


class _Files:
    __slots__ = ("answers", "asked_at", "nudged", "requests", "signalled", "stacks_request", "tid")

    def __init__(self, answers: int, requests: int, signalled: int) -> None:
        self.answers = answers
        self.requests = requests
        self.signalled = signalled  # rank<N>.sig
        self.tid: int | None = None
        self.stacks_request = 0  # the stacks request outstanding (0: none)
        self.asked_at = 0.0
        self.nudged = False  # the helper was signalled for it


def make_helper_files(base: str, *, fifo_only: bool = False) -> None:
    """Make the helper's files of the rank whose dump file is ``base`` (0600, never following
    a link): its request FIFO and, unless ``fifo_only``, its answer and signal files, empty
    (for a :class:`RankHelpers` made later with ``made=True``)."""
    os.mkfifo(base + REQUEST_SUFFIX, 0o600)
    if not fifo_only:
        for suffix in (ANSWER_SUFFIX, SIGNAL_SUFFIX):
            os.close(os.open(base + suffix, _FLAGS, 0o600))


class RankHelpers:
    """The helper files of one job's ranks (``local_ranks`` in ``directory``, next to the dump
    files ``rank<N>``), made here, or with ``made`` found made already
    (:func:`make_helper_files`). :meth:`close` closes them; the directory's owner removes
    them."""

    def __init__(
        self, directory: str, local_ranks: Iterable[int], *, made: bool = False
    ) -> None:
        self.directory = directory
        self._files: dict[int, _Files] = {}
        self._request = 0
        flags = _FLAGS & ~(os.O_CREAT | os.O_EXCL) if made else _FLAGS
        try:
            for local_rank in local_ranks:
                base = os.path.join(directory, f"rank{local_rank}")
                if not made:
                    make_helper_files(base, fifo_only=True)
                answers = forkexec.track(os.open(base + ANSWER_SUFFIX, flags, 0o600))
                signalled = forkexec.track(os.open(base + SIGNAL_SUFFIX, flags, 0o600))
                requests = forkexec.track(os.open(
                    base + REQUEST_SUFFIX, os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
                ))  # fmt: skip
                self._files[local_rank] = _Files(answers, requests, signalled)
        except BaseException:
            self.close()
            raise

    def _header(self, local_rank: int) -> tuple[int, int, str, int, int] | None:
        """(request, tid, status, body length, header length) of the answer there now."""
        files = self._files.get(local_rank)
        if files is None:
            return None
        try:
            head = os.pread(files.answers, _HEADER_LIMIT, 0)
        except OSError:
            return None
        line, newline, _ = head.partition(b"\n")
        if not newline:
            return None
        fields = line.split(b" ")
        if len(fields) != 5 or fields[0] != ANSWER_MAGIC:
            return None
        request, tid, status, length = fields[1:]
        if not (request.isdigit() and tid.isdigit() and length.isdigit()):
            return None
        text = status.decode("ascii", "replace")
        if text not in (*STATUSES, "ready") or len(request) > 18 or len(length) > 18:
            return None
        return int(request), int(tid), text, int(length), len(line) + 1

    def thread_id(self, local_rank: int) -> int | None:
        """The rank's helper thread id, once its helper said it (then remembered); None when
        it did not (yet)."""
        files = self._files.get(local_rank)
        if files is None:
            return None
        if files.tid is None:
            header = self._header(local_rank)
            if header is not None and header[1] > 0:
                files.tid = header[1]
        return files.tid

    def forget(self, local_rank: int) -> None:
        """The helper is gone (its thread no longer the rank's): signal the process again."""
        files = self._files.get(local_rank)
        if files is not None:
            files.tid = None
            files.stacks_request = 0

    def request(self, local_ranks: Sequence[int], *, stacks: bool, flight: bool) -> tuple[
        int, list[int]
    ]:  # fmt: skip
        """Ask ``local_ranks`` for their stacks and/or flight recorder in one request: (the
        request number, the local ranks whose FIFO took it). Asking for stacks empties the
        signal file and makes this the rank's outstanding stacks request."""
        self._request += 1
        what = ("s" if stacks else "") + ("f" if flight else "")
        line = f"{self._request} {what}\n".encode()
        sent = []
        now = time.monotonic()
        for local_rank in local_ranks:
            files = self._files.get(local_rank)
            if files is None:
                continue
            try:
                if stacks:
                    os.ftruncate(files.signalled, 0)
                if os.write(files.requests, line) != len(line):
                    continue
            except OSError:  # full (a rank that never reads): not asked
                continue
            if stacks:
                files.stacks_request, files.asked_at, files.nudged = self._request, now, False
            sent.append(local_rank)
        return self._request, sent

    def stacks_dump(self, local_rank: int, stacks_fd: int) -> bytes:
        """The dump answering the rank's outstanding stacks request so far (the helper's, from
        the dump file ``stacks_fd``; else, once signalled, the handler's); empty when none."""
        files = self._files.get(local_rank)
        if files is None or not files.stacks_request:
            return b""
        data = _read(stacks_fd)
        start = data.rfind(STACKS_MAGIC + b" ")
        if start >= 0 and (start == 0 or data[start - 1 : start] == b"\n"):
            line, newline, rest = data[start:].partition(b"\n")
            if newline and line[len(STACKS_MAGIC) + 1 :] == str(files.stacks_request).encode():
                return rest
        return _read(files.signalled) if files.nudged else b""

    def should_nudge(self, local_rank: int, pid: int) -> bool:
        """Whether to signal the rank now: its stacks request unanswered for
        :data:`NUDGE_AFTER` seconds, not signalled for it yet, and the helper asleep (module
        docstring). Marks it signalled when True."""
        files = self._files.get(local_rank)
        if (files is None or files.tid is None or not files.stacks_request or files.nudged
                or time.monotonic() - files.asked_at < NUDGE_AFTER):  # fmt: skip
            return False
        if thread_state(pid, files.tid) != "S":
            return False
        files.nudged = True
        return True

    def nudged(self, local_rank: int) -> bool:
        """Whether the rank was signalled for its outstanding stacks request."""
        files = self._files.get(local_rank)
        return files is not None and bool(files.stacks_request) and files.nudged

    def answer(self, local_rank: int, request: int) -> tuple[str, bytes] | None:
        """(status, body) of the rank's flight-recorder answer to ``request``, once complete;
        None before (no answer yet, an older one, one still being written)."""
        header = self._header(local_rank)
        if header is None or header[0] != request or header[2] == "ready":
            return None
        _, _, status, length, start = header
        if length > FLIGHT_LIMIT:
            return "error", b"the answer is larger than numarun reads"
        files = self._files[local_rank]
        try:
            body = os.pread(files.answers, length + 1, start)
        except OSError:
            return None
        if len(body) != length:
            return None  # still being written (or replaced meanwhile)
        return status, body

    def close(self) -> None:
        for files in self._files.values():
            forkexec.close(files.answers)
            forkexec.close(files.requests)
            forkexec.close(files.signalled)
        self._files.clear()


def _read(fd: int) -> bytes:
    try:
        size = os.fstat(fd).st_size
        return os.pread(fd, min(size, _MAX_DUMP), 0) if size else b""
    except OSError:
        return b""


def read_proc(path: str, size: int) -> bytes | None:
    """At most ``size`` bytes of a ``/proc`` file in one read (its contents as of that read);
    None when it cannot be opened or read (the process or thread is gone)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, size)
    except OSError:
        return None
    finally:
        os.close(fd)


def thread_state(pid: int, tid: int) -> str | None:
    """Thread ``tid`` of ``pid``'s state letter (``R``, ``S``, ``D``, ...) from ``/proc``; None
    when it is gone."""
    data = read_proc(f"/proc/{pid}/task/{tid}/stat", 4096)
    if data is None:
        return None
    after = data.rpartition(b")")[2].split()
    return after[0].decode("ascii", "replace") if after else None


def reason_text(body: bytes) -> str:
    """A rank's reason (``none``/``error`` answers), as one line of at most 300 characters."""
    text = body[:1200].decode("utf-8", "replace")
    text = " ".join(text.split())
    return text[:300]
