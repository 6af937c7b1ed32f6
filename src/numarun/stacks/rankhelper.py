"""The launcher's side of each rank's helper thread (:mod:`numarun.worker.dumphandler`): which
thread the stack signal goes to, and the flight recorder asked for and read back.

Files, beside each rank's dump file ``rank<N>`` in the job's private 0700 directory, made here
before the rank starts (0600; the rank opens them, never creates them): ``rank<N>.fr``, the
helper's answers, and ``rank<N>.req``, a FIFO the launcher writes request lines to (opened
read-write and non-blocking here, so a write never waits for the rank, and a rank that never
reads costs at most the FIFO's buffer).

The helper's first line, written before the rank installs its dump handler, carries its native
thread id (:meth:`RankHelpers.thread_id`): the launcher then signals that thread only. A rank
without that line (its helper could not start, or it is not numarun's bootstrap) is signalled
as a process, as before the helper existed.

A flight-recorder request is a request number; the helper answers with that number, its status
and the dump (:class:`FlightAnswer`). Everything read back is the user's process's: an answer
is read at most :data:`~numarun.worker.dumphandler.FLIGHT_LIMIT` bytes (plus its header), and a
header that does not parse is no answer. Never parsed here: :mod:`numarun.stacks.flight` reads
the dump.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from numarun.process import forkexec
from numarun.worker.dumphandler import ANSWER_MAGIC, ANSWER_SUFFIX, FLIGHT_LIMIT, REQUEST_SUFFIX

_HEADER_LIMIT = 128  # bytes of an answer's header line, at most
STATUSES = ("ok", "none", "absent", "error")


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
    __slots__ = ("answers", "requests", "tid")

    def __init__(self, answers: int, requests: int) -> None:
        self.answers = answers
        self.requests = requests
        self.tid: int | None = None


class RankHelpers:
    """The helper files of one job's ranks (``local_ranks`` in ``directory``, next to the dump
    files ``rank<N>``). :meth:`close` closes them; the directory's owner removes them."""

    def __init__(self, directory: str, local_ranks: Iterable[int]) -> None:
        self.directory = directory
        self._files: dict[int, _Files] = {}
        self._request = 0
        try:
            for local_rank in local_ranks:
                base = os.path.join(directory, f"rank{local_rank}")
                answers = os.open(
                    base + ANSWER_SUFFIX,
                    os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                    0o600,
                )
                forkexec.track(answers)
                os.mkfifo(base + REQUEST_SUFFIX, 0o600)
                requests = os.open(
                    base + REQUEST_SUFFIX,
                    os.O_RDWR | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC,
                )
                forkexec.track(requests)
                self._files[local_rank] = _Files(answers, requests)
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

    def request(self, local_ranks: Sequence[int]) -> tuple[int, list[int]]:
        """Ask ``local_ranks`` for their flight recorder: (the request number, the local ranks
        whose FIFO took the request)."""
        self._request += 1
        line = b"%d\n" % self._request
        sent = []
        for local_rank in local_ranks:
            files = self._files.get(local_rank)
            if files is None:
                continue
            try:
                if os.write(files.requests, line) == len(line):
                    sent.append(local_rank)
            except OSError:  # full (a rank that never reads): not asked
                continue
        return self._request, sent

    def answer(self, local_rank: int, request: int) -> tuple[str, bytes] | None:
        """(status, body) of the rank's answer to ``request``, once it is complete; None
        before (no answer yet, an older one, one still being written)."""
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
        self._files.clear()


def reason_text(body: bytes) -> str:
    """A rank's reason (``none``/``error`` answers), as one line of at most 300 characters."""
    text = body[:1200].decode("utf-8", "replace")
    text = " ".join(text.split())
    return text[:300]
