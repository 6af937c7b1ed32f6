"""The non-blocking console: the launcher's stdout or stderr as tee'd workers' lines reach it.

A :class:`Console` never blocks its caller (the supervisor's loop): what the terminal or pipe
does not take now waits, in order, up to ``limit`` bytes (4 MiB), for :meth:`Console.flush`,
which the supervisor calls whenever the console is writable; beyond that whole batches of lines
are dropped and one line ``[numarun: N lines dropped from console]`` stands where they were. A
console that is gone (``EPIPE`` after ``| head``, ``EIO``) takes nothing more. The class says how
each kind of file is written without setting ``O_NONBLOCK`` on a description others share.
:func:`console_for` gives every fd open on the same pipe, terminal or file one shared console.
"""

from __future__ import annotations

import os
import select
import weakref
from collections.abc import Callable

__all__ = ["DEFAULT_CONSOLE_LIMIT", "Console", "console_for"]


# Console output the terminal (or the pipe after `numarun ... |`) has not taken yet, per console.
# Beyond this, whole batches of lines are dropped and a note says how many; the per-rank log
# files still get every byte.
DEFAULT_CONSOLE_LIMIT = 4 * 1024 * 1024
_CONSOLE_CHUNK = 256 * 1024
_PTMX = (5, 2)  # /dev/ptmx: opening it again would make a new pseudo-terminal


class Console:
    """One console (the launcher's stdout or stderr) shared by every tee'd stream shown on it.

    :meth:`write` never blocks: it writes what the console takes now and keeps the rest, in
    order, for :meth:`flush`, which the supervisor calls whenever the console becomes writable
    (it watches :meth:`fileno` while :meth:`pending`). Nothing is lost while at most ``limit``
    bytes wait; beyond that whole batches of lines are dropped and, once the console takes
    output again, one line ``[numarun: N lines dropped from console]`` stands where they were.
    A console that is gone (``EPIPE`` after ``| head``, ``EIO``) sets :attr:`gone` and takes
    nothing more. :meth:`abandon` drops what still waits (the run is over, the reader stalled).

    Writing without blocking must not set ``O_NONBLOCK`` on the caller's fd: the flag belongs
    to the open file description, which the console's other writers share (a rank that is not
    tee'd writes to the same description, so do the shell and the other processes of a
    pipeline stage); they would get ``EAGAIN`` and a Python ``print`` would raise. So a pipe,
    FIFO or terminal is opened again through ``/proc/self/fd`` -- a description of its own on
    the same pipe or terminal -- and only that one is non-blocking. A socket gets
    ``send(MSG_DONTWAIT)``. A regular file or ``/dev/null`` never waits for a reader and is
    written directly. Where the reopen fails, each write is at most ``PIPE_BUF`` bytes and
    only after ``poll`` says the console has room (a racing writer could still block it).
    """

    def __init__(self, fd: int, *, limit: int = DEFAULT_CONSOLE_LIMIT) -> None:
        self.limit = limit
        self.gone = False
        self.dropped_lines = 0  # in all
        self._unreported = 0  # dropped lines the console has not been told about yet
        self._midline = False  # the last byte the console took was not a newline
        self._buffer = bytearray()
        self._target = fd
        self._fd, self._send, closer = _nonblocking_writer(fd)
        # An fd of its own closes with the console, at the latest when the last sink showing
        # on it is gone.
        self._release = weakref.finalize(self, closer) if closer else _nothing

    def fileno(self) -> int:
        """The fd to wait on for writability while :meth:`pending`."""
        return self._fd

    def pending(self) -> bool:
        """Output (or a note about dropped lines) waits for the console."""
        return not self.gone and bool(self._buffer or self._unreported)

    def write(self, text: bytes) -> None:
        """Show ``text`` (whole lines) after everything shown before; never blocks."""
        if self.gone or not text:
            return
        if self._buffer or self._unreported:
            if len(self._buffer) + len(text) > self.limit:
                lines = text.count(b"\n")
                self.dropped_lines += lines
                self._unreported += lines
            else:
                self._note_dropped()
                self._buffer += text
            self.flush()
            return
        written = self._send_some(memoryview(text))
        if written < len(text) and not self.gone:
            self._buffer += text[written:]

    def flush(self) -> bool:
        """Write what waits, as far as the console takes it now; True if anything went."""
        progress = False
        while not self.gone:
            if not self._buffer:
                if not self._unreported:
                    break
                self._note_dropped()
            chunk = bytes(self._buffer[:_CONSOLE_CHUNK])
            written = self._send_some(memoryview(chunk))
            if written:
                del self._buffer[:written]
                progress = True
            if written < len(chunk):
                break
        return progress

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything waiting is shown, ``timeout`` seconds pass or the console is
        gone; True when nothing waits. For callers without the supervisor's loop."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        poller = select.poll()
        poller.register(self._fd, select.POLLOUT)
        while self.pending():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                break
            poller.poll(None if left is None else max(1, int(left * 1000)))
            self.flush()
        return not self.pending()

    def abandon(self) -> None:
        """Drop what still waits; say so on the console if it takes one more line now."""
        if self.gone:
            return
        lines = self._buffer.count(b"\n")
        self.dropped_lines += lines
        self._unreported += lines
        self._buffer.clear()
        self._note_dropped()
        self._send_some(memoryview(bytes(self._buffer)))
        self._buffer.clear()

    def close(self) -> None:
        """Release the console's own fd (if it opened one); what waits is dropped."""
        self.gone = True
        self._buffer.clear()
        self._release()

    def _note_dropped(self) -> None:
        # Batches are whole lines, so the buffer ends on a line boundary; only after abandon()
        # cut a line short does the note need a newline of its own first.
        if not self._unreported:
            return
        start = b"\n" if self._midline and not self._buffer else b""
        self._buffer += start + b"[numarun: %d lines dropped from console]\n" % self._unreported
        self._unreported = 0

    def _send_some(self, view: memoryview) -> int:
        """Write from ``view`` until the console would block; the count written."""
        done = 0
        while done < len(view):
            try:
                written = self._send(view[done:])
            except InterruptedError:
                continue
            except BlockingIOError:
                break
            except OSError:
                # EPIPE after `| head`, EIO from a hung-up terminal: nobody can read it any more.
                self.gone = True
                self._buffer.clear()
                self._unreported = 0
                break
            if written <= 0:
                break
            done += written
        if done:
            self._midline = view[done - 1] != 0x0A
        return done


def _nothing() -> None:
    pass


def _nonblocking_writer(
    fd: int,
) -> tuple[int, Callable[[memoryview], int], Callable[[], None] | None]:
    """(fd to poll, send(view) -> count written or BlockingIOError, closer or None) for
    console ``fd``; :class:`Console` says why each kind of file is written the way it is."""
    import stat

    try:
        info = os.fstat(fd)
    except OSError:
        return fd, lambda view: os.write(fd, view), None  # closed: the first write says so
    mode = info.st_mode
    if stat.S_ISSOCK(mode):
        import socket

        sock = socket.socket(fileno=os.dup(fd))
        return sock.fileno(), lambda view: sock.send(view, socket.MSG_DONTWAIT), sock.close
    is_tty = stat.S_ISCHR(mode) and os.isatty(fd)
    if not (stat.S_ISFIFO(mode) or is_tty):
        return fd, lambda view: os.write(fd, view), None  # files and /dev/null never wait
    if not (is_tty and (os.major(info.st_rdev), os.minor(info.st_rdev)) == _PTMX):
        try:
            own = os.open(
                f"/proc/self/fd/{fd}", os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
            )
        except OSError:
            own = -1
        if own >= 0:
            again = os.fstat(own)
            if (again.st_dev, again.st_ino, again.st_rdev) == (
                info.st_dev,
                info.st_ino,
                info.st_rdev,
            ):
                return own, lambda view: os.write(own, view), lambda: os.close(own)
            os.close(own)
    poller = select.poll()
    poller.register(fd, select.POLLOUT)

    def send_when_ready(view: memoryview) -> int:
        if not poller.poll(0):
            raise BlockingIOError
        return os.write(fd, view[: select.PIPE_BUF])

    return fd, send_when_ready, None


_consoles: weakref.WeakValueDictionary[tuple[int, int], Console] = weakref.WeakValueDictionary()


def console_for(fd: int) -> Console:
    """The :class:`Console` for ``fd``, shared with every other fd open on the same pipe,
    terminal or file (``2>&1`` gives stdout and stderr one console, so their lines keep
    their order and never split each other)."""
    try:
        info = os.fstat(fd)
    except OSError:
        return Console(fd)
    key = (info.st_dev, info.st_ino)
    console = _consoles.get(key)
    if console is not None and not console.gone and _same_file(console._target, key):
        return console
    console = Console(fd)
    _consoles[key] = console
    return console


def _same_file(fd: int, key: tuple[int, int]) -> bool:
    try:
        info = os.fstat(fd)
    except OSError:
        return False
    return (info.st_dev, info.st_ino) == key
