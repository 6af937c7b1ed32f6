"""The output sinks the supervisor feeds: a worker stream's bytes to a file, a console, nowhere.

The supervisor reads each worker's stdout and stderr from pipes and hands the raw chunks, in
order, to one *sink* per stream (``feed(data)``; ``close()`` once at EOF;
:class:`numarun.process.spec.OutputSink`). This module holds the sinks:

* :class:`FileSink` writes the bytes to a file (``stdout.log`` / ``stderr.log``) untouched.
* :class:`TeeSink` writes the bytes to the file too, and shows *complete lines* on the
  launcher's console, each after a prefix (torchrun's ``[default3]:``), one batch of lines at
  a time, so two ranks' half-lines can never merge into one console line; with a
  :class:`LineFilter` it also copies matching lines to one shared file (torchrun's
  ``--duplicate-stdout-filters``). The console is a :class:`numarun.process.console.Console`:
  it never blocks the supervisor's loop.
* :class:`NullSink` drops the bytes (a rank hidden by ``--local-ranks-filter`` whose stream is
  neither redirected nor tee'd, as torchrun sends it to ``/dev/null``).

:func:`log_loss` tells what a sink's file lost for good (a full disk), for the end-of-run report.
Which sinks a launched worker gets, in torchrun's layout, is :mod:`numarun.launch.output`'s choice.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

from numarun.process.console import Console, console_for

__all__ = [
    "DEFAULT_MAX_HELD",
    "DEFAULT_MAX_PENDING",
    "FileSink",
    "LineFilter",
    "NullSink",
    "TeeSink",
    "log_loss",
]


# A line longer than this without a newline is shown in pieces, so a worker printing a progress
# bar with \r forever (or binary garbage) cannot make the launcher hold unbounded memory.
DEFAULT_MAX_HELD = 64 * 1024


def _open_log(path: str | os.PathLike[str]) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)


# What a log file that cannot be written (disk full) keeps in memory until it can: the newest
# bytes, so that a crash's last lines survive; older ones are dropped and counted.
DEFAULT_MAX_PENDING = 1024 * 1024
_RETRY_CHUNK = 256 * 1024  # bytes offered per write while a file catches up


class FileSink:
    """Write one stream's raw bytes to a file, unbuffered (torchrun's ``stdout.log``).

    The file is created (truncated) when the sink is made, so an empty file means the worker
    wrote nothing; ``OSError`` from creating it propagates. Each ``feed`` is written in full
    before it returns (no user-space buffer), so whatever a worker wrote before it was killed,
    half lines included, is in the file.

    A failed write (disk full, quota, I/O error) must neither take a training run down nor
    lose data for good when the space comes back: what cannot be written waits in memory, in
    order -- at most ``max_pending`` bytes (1 MiB), the newest; older ones are dropped and
    counted in :attr:`lost` -- and every later ``feed``, and ``close``, tries again. Where
    bytes were dropped, the file gets one line ``[numarun: N bytes lost here: <reason>]``.
    The first failure is said once on stderr; :attr:`error` keeps the last one and
    :attr:`lost` the bytes that never reached the file (what still waits at ``close``
    included), for the end-of-run report (:func:`log_loss`). ``write`` (``os.write``) is
    the system call, for tests. ``close`` closes the file; a second ``close`` does nothing;
    ``feed`` after ``close`` raises ``ValueError``. ``fd``: a file already open for writing
    (made relative to a directory descriptor, say), which the sink then owns and closes; the
    sink opens nothing and ``path`` only names the file in messages.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        write: Callable[[int, memoryview], int] = os.write,
        fd: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.error: OSError | None = None
        self.lost = 0
        self._fd: int | None = _open_log(path) if fd is None else fd
        self._closed = False
        self._write = write
        self._max_pending = max_pending
        self._pending = bytearray()  # worker bytes not written yet, in order
        self._note = bytearray()  # a "bytes lost here" line being written before them
        self._gap = 0  # bytes dropped just before _pending[0] and not yet noted in the file
        self._note_count = 0  # the bytes _note speaks of
        self._note_started = False  # part of _note is in the file already
        self._midline = False  # the last byte in the file is not a newline

    def feed(self, data: bytes) -> None:
        if self._closed:
            raise ValueError(f"feed() after close() on {self.path}")
        if self._pending or self._note or self._gap:
            self._retry()  # what waits goes first; space may have come back
            if self._pending or self._note or self._gap:
                self._pending += data
                self._bound()
                return
        written = self._write_some(data)
        if written < len(data):
            self._pending += data[written:]
            self._bound()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._pending or self._note or self._gap:
            self._retry()  # the last chance: space may have come back
            self.lost += len(self._pending) + self._gap
            self._pending.clear()
            self._gap = 0
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _bound(self) -> None:
        excess = len(self._pending) - self._max_pending
        if excess > 0:
            del self._pending[:excess]
            self._gap += excess
            self.lost += excess

    def _retry(self) -> None:
        while True:
            if self._gap and (not self._note or not self._note_started):
                # One note per gap: a note not begun yet takes the newer losses in.
                count = self._gap + (self._note_count if self._note else 0)
                reason = (self.error.strerror or str(self.error)) if self.error else "?"
                self._note[:] = b"%s[numarun: %d bytes lost here: %s]\n" % (
                    b"\n" if self._midline else b"",
                    count,
                    reason.encode("utf-8", "replace"),
                )
                self._note_count, self._gap = count, 0
            waiting = self._note or self._pending
            if not waiting:
                return
            chunk = bytes(waiting[:_RETRY_CHUNK])
            written = self._write_some(chunk)
            del waiting[:written]
            if waiting is self._note:
                self._note_started = bool(self._note) and (written > 0 or self._note_started)
            if written < len(chunk):
                return

    def _write_some(self, data: bytes) -> int:
        """Write as much of ``data`` as the file takes now; the count written."""
        assert self._fd is not None
        view = memoryview(data)
        done = 0
        while done < len(view):
            try:
                written = self._write(self._fd, view[done:])
            except InterruptedError:
                continue
            except OSError as err:
                if self.error is None:
                    sys.stderr.write(
                        f"numarun: cannot write {self.path}: {err.strerror or err}; keeping up "
                        f"to {self._max_pending >> 10} KiB of it in memory and trying again\n"
                    )
                    sys.stderr.flush()
                self.error = err
                break
            if written <= 0:
                break
            done += written
        if done:
            self._midline = view[done - 1] != 0x0A
        return done


def log_loss(sink: object) -> tuple[Path, int, str] | None:
    """``(path, bytes lost, reason)`` when ``sink``'s log file (a :class:`FileSink`, or a
    :class:`TeeSink`'s file) lost bytes that never came back; else None. Call after close."""
    file = sink if isinstance(sink, FileSink) else getattr(sink, "file", None)
    if not isinstance(file, FileSink) or not file.lost:
        return None
    error = file.error
    reason = (error.strerror or str(error)) if error is not None else "write failed"
    return file.path, file.lost, reason


class NullSink:
    """Drop one stream's bytes (a hidden rank's stream that goes to no file)."""

    def feed(self, data: bytes) -> None:
        pass

    def close(self) -> None:
        pass


class LineFilter:
    """Copy the lines that contain any of ``needles`` to one file, each after its rank's prefix
    (torchrun's ``--duplicate-stdout-filters``: ``filtered_stdout.log`` for all ranks).

    Shared by the :class:`TeeSink` of every rank of one stream; each batch of lines is one
    write, so ranks' lines never merge. The file is created when the filter is made; write
    errors are handled as in :class:`FileSink`. ``close`` once, after every sink is closed.
    ``fd``: the file already open, as for :class:`FileSink`.
    """

    def __init__(
        self, path: str | os.PathLike[str], needles: tuple[str, ...], *, fd: int | None = None
    ) -> None:
        self._file = FileSink(path, fd=fd)
        self._needles = tuple(needle.encode("utf-8", "surrogateescape") for needle in needles)

    def feed_lines(self, prefix: bytes, lines: bytes) -> None:
        """``lines``: complete lines, each ending with ``b"\\n"``."""
        picked = [
            line
            for line in lines[:-1].split(b"\n")
            if any(needle in line for needle in self._needles)
        ]
        if picked:
            self._file.feed(b"".join(prefix + line + b"\n" for line in picked))

    def close(self) -> None:
        self._file.close()


class TeeSink:
    """Write a stream's raw bytes to a file and its lines, prefixed, to the console.

    * File (when ``path`` is not None): every byte as fed, at once, as :class:`FileSink`.
    * Console (when ``show``): only complete lines -- ``b"\\n"`` is the only line end, so
      ``\\r`` progress bars stay inside their line -- each preceded by ``prefix``. All complete
      lines of one ``feed`` go to the console as ONE batch, as soon as they arrive; the
      supervisor calls sinks one at a time and sinks sharing a console share its queue, so
      output of two sinks never interleaves below line granularity. The bytes after the last
      newline are held until their newline arrives; at ``close()`` a held partial line is
      shown with a newline added.
    * Memory bound: when more than ``max_held`` bytes (64 KiB) are held without a newline, they
      are shown at once as a line of their own (newline added) and the rest of that line comes
      later under a new prefix. The file still has the line unbroken.
    * A line that already starts with ``prefix`` (``[rank1]: `` from torch's own
      excepthook, with that prefix template) is shown without a second one.
    * ``duplicate`` (when shown): the shown lines also go through this :class:`LineFilter`.
    * The console never blocks the caller: ``console_fd`` (an fd, or a :class:`Console`)
      gets one shared :class:`Console` per pipe, terminal or file, which keeps what the
      console cannot take yet (up to its limit, then drops whole lines with a note) until the
      supervisor sees it writable. A console that is gone (``EPIPE``, e.g. ``numarun ... |
      head``, or ``EIO``) stops the console part of this sink silently; the file (and
      ``duplicate``) keep receiving everything. File write errors are handled as in
      :class:`FileSink`. ``fd``: the file already open, as for :class:`FileSink`.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        console_fd: int | Console,
        prefix: bytes,
        show: bool = True,
        *,
        max_held: int = DEFAULT_MAX_HELD,
        duplicate: LineFilter | None = None,
        fd: int | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        self._file = None if path is None else FileSink(path, fd=fd)
        self.file = self._file  # for log_loss()
        # The supervisor flushes this console when it becomes writable (see Console).
        self.console: Console | None = None
        if show:
            self.console = (
                console_fd if isinstance(console_fd, Console) else console_for(console_fd)
            )
        self._prefix = bytes(prefix)
        self._show = show
        self._console_ok = True
        self._duplicate = duplicate if show else None
        self._max_held = max_held
        self._held = b""
        self._closed = False

    def feed(self, data: bytes) -> None:
        if self._closed:
            raise ValueError(f"feed() after close() on the tee of {self._prefix!r}")
        if self._file is not None:
            self._file.feed(data)
        if not self._show or not data:
            return
        end = data.rfind(b"\n")
        if end < 0:
            self._held += data
            if len(self._held) > self._max_held:
                self._emit(self._held + b"\n")
                self._held = b""
            return
        lines = self._held + data[: end + 1]
        self._held = data[end + 1 :]
        if len(self._held) > self._max_held:
            lines += self._held + b"\n"
            self._held = b""
        self._emit(lines)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            if self._show and self._held:
                self._emit(self._held + b"\n")
            self._held = b""
        finally:
            if self._file is not None:
                self._file.close()

    def _emit(self, lines: bytes) -> None:
        """Show complete ``lines`` (ending with b"\\n") and hand them to ``duplicate``."""
        if self._console_ok:
            self._show_text(self._framed(lines))
        if self._duplicate is not None:
            self._duplicate.feed_lines(self._prefix, lines)

    def _framed(self, lines: bytes) -> bytes:
        # lines ends with b"\n"; put the prefix before each line with one C-level replace.
        prefix = self._prefix
        text = prefix + lines[:-1].replace(b"\n", b"\n" + prefix) + b"\n"
        if prefix and prefix + prefix in text:
            # Some line carried the prefix already (torch's excepthook writes "[rank1]: "):
            # frame line by line so that it is not prefixed twice.
            text = b"".join(
                (line if line.startswith(prefix) else prefix + line) + b"\n"
                for line in lines[:-1].split(b"\n")
            )
        return text

    def _show_text(self, text: bytes) -> None:
        assert self.console is not None
        self.console.write(text)
        if self.console.gone:
            # EPIPE after `| head`, EIO from a hung-up terminal: nobody can read it any more,
            # and the file still gets everything.
            self._console_ok = False
