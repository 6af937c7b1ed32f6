"""Worker output: per-rank log files in torchrun's layout, ``--tee`` line framing, redirect specs.

The supervisor reads each worker's stdout and stderr from pipes and hands the raw chunks, in
order, to one *sink* per stream (``feed(data)``; ``close()`` once at EOF). This module makes
those sinks:

* :class:`FileSink` writes the bytes to ``stdout.log`` / ``stderr.log`` untouched.
* :class:`TeeSink` writes the bytes to the file too, and shows *complete lines* on the
  launcher's console, each with torchrun's ``[default3]:`` prefix (role and local rank), one
  batch of lines at a time, so two ranks' half-lines can never merge into one console line;
  with a :class:`LineFilter` it also copies matching lines to one shared file (torchrun's
  ``--duplicate-stdout-filters``). The console is a :class:`Console`: it never blocks the
  supervisor's loop (a stalled terminal or pipe reader makes it queue, up to a limit, then
  drop whole lines with a note).
* :class:`NullSink` drops the bytes (a rank hidden by ``--local-ranks-filter`` whose stream is
  neither redirected nor tee'd, as torchrun sends it to ``/dev/null``).

Directory layout (the issue's; torchrun's differs only in adding a random suffix to the run
directory)::

    LOG_DIR/<run_id>/attempt_0/<local_rank>/stdout.log
                                            stderr.log
                                            error.json   # $TORCHELASTIC_ERROR_FILE
                              filtered_stdout.log  # --duplicate-stdout-filters, all ranks
                              filtered_stderr.log  # --duplicate-stderr-filters

``Std`` values follow torchrun: 0 none, 1 stdout, 2 stderr, 3 both.
"""

from __future__ import annotations

import enum
import os
import select
import sys
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path

from numarun.errors import UsageError
from numarun.process.spec import OutputSink

__all__ = [
    "DEFAULT_CONSOLE_LIMIT",
    "DEFAULT_MAX_HELD",
    "DEFAULT_MAX_PENDING",
    "PREFIX_TEMPLATE_ENV",
    "Console",
    "FileSink",
    "LineFilter",
    "NullSink",
    "OutputSink",
    "Std",
    "TeeSink",
    "console_for",
    "error_file_path",
    "log_loss",
    "make_log_dirs",
    "make_prefix",
    "parse_ranks_filter",
    "parse_std_spec",
    "rank_log_dir",
    "sinks_for",
    "write_all",
]

PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"

# A line longer than this without a newline is shown in pieces, so a worker printing a progress
# bar with \r forever (or binary garbage) cannot make the launcher hold unbounded memory.
DEFAULT_MAX_HELD = 64 * 1024

STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
ERROR_JSON = "error.json"


class Std(enum.IntFlag):
    """Which standard streams a ``--redirects`` / ``--tee`` value covers (torchrun's values)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = 3


_STD_FORMS = (
    "use 0 (none), 1 (stdout), 2 (stderr) or 3 (both) for every rank, "
    "or LOCAL_RANK:VALUE pairs such as 0:3,1:0"
)


def parse_std_spec(text: str, nprocs: int, *, flag: str = "--redirects/--tee") -> dict[int, int]:
    """Parse a ``--redirects`` / ``--tee`` value into ``{local_rank: Std value}`` for every rank.

    ``"0"``..``"3"`` apply to all ``nprocs`` local ranks; ``"0:3,1:0"`` names local ranks one by
    one and ranks not named get 0. Whitespace around the whole value and around items is
    ignored. Anything else -- another number (``"4"``), a non-number, an empty item or value
    (``"0:"``, ``""``), a local rank outside ``0..nprocs-1``, a rank named twice -- raises
    :class:`UsageError` with one line naming ``flag``, the value, and the valid forms.
    """
    value = text.strip()

    def bad(why: str) -> UsageError:
        return UsageError(f"{flag} {text!r} is not valid ({why}): {_STD_FORMS}")

    if ":" not in value:
        level = _std_value(value)
        if level is None:
            raise bad("not a value 0-3")
        return dict.fromkeys(range(nprocs), level)
    spec = dict.fromkeys(range(nprocs), 0)
    named: set[int] = set()
    for item in value.split(","):
        rank_text, sep, level_text = item.strip().partition(":")
        rank_text = rank_text.strip()
        if not sep or not rank_text.isdigit() or not rank_text.isascii():
            raise bad(f"item {item.strip()!r} is not LOCAL_RANK:VALUE")
        rank = int(rank_text)
        level = _std_value(level_text.strip())
        if level is None:
            raise bad(f"item {item.strip()!r} needs a value 0-3 after the colon")
        if rank >= nprocs:
            raise bad(f"local rank {rank} does not exist with {nprocs} processes per node")
        if rank in named:
            raise bad(f"local rank {rank} is given twice")
        named.add(rank)
        spec[rank] = level
    return spec


def _std_value(text: str) -> int | None:
    if len(text) == 1 and text in "0123":
        return int(text)
    return None


def parse_ranks_filter(text: str, nprocs: int) -> set[int]:
    """Parse ``--local-ranks-filter`` (``"0,2"``): the local ranks whose output is shown.

    An empty (or all-blank) value means no filter: every rank ``0..nprocs-1`` is returned. Items
    are comma-separated non-negative integers below ``nprocs``; spaces around items are ignored,
    repeats are harmless. Anything else raises :class:`UsageError` (one line).
    """
    if not text.strip():
        return set(range(nprocs))
    shown: set[int] = set()
    for item in text.split(","):
        word = item.strip()
        if not (word.isdigit() and word.isascii()):
            raise UsageError(
                f"--local-ranks-filter {text!r} is not valid: give comma-separated local ranks "
                f"such as 0,2 (0-{nprocs - 1})"
            )
        rank = int(word)
        if rank >= nprocs:
            raise UsageError(
                f"--local-ranks-filter {text!r} names local rank {rank}, but there are only "
                f"{nprocs} processes per node (0-{nprocs - 1})"
            )
        shown.add(rank)
    return shown


def make_log_dirs(
    log_dir: str | os.PathLike[str] | None, run_id: str, nprocs: int, *, announce: bool = True
) -> Path:
    """Create ``LOG_DIR/<run_id>/attempt_0/<local_rank>/`` for each rank; return the attempt dir.

    With ``log_dir`` None, LOG_DIR is a fresh ``tempfile.mkdtemp(prefix="numarun_")`` (torchrun
    does the same with ``torchelastic_``) and, if ``announce``, one line on stderr says where.
    Nothing is ever deleted: when ``LOG_DIR/<run_id>`` already exists (an earlier run, or
    another node's numarun sharing the file system and the run id) this run takes a new
    ``LOG_DIR/<run_id>_<random>/`` instead -- torchrun's naming -- and, if ``announce``, says
    so on stderr. The ``<run_id>`` directory is claimed with one atomic ``mkdir``, so two
    launchers starting at once never share a directory, and a stale ``error.json`` can never
    be read as this run's. Bad input raises :class:`UsageError`: a run id that is empty,
    ``.``/``..`` or contains ``/`` or NUL, a LOG_DIR that exists but is not a directory, one
    that belongs to another user than the caller's effective uid or root (its owner could swap
    a directory of ours for a symbolic link and make us write elsewhere, as root anywhere), or
    one that cannot be created.
    """
    if not run_id or run_id in (".", "..") or "/" in run_id or "\0" in run_id:
        raise UsageError(
            f"run id {run_id!r} cannot name a log directory: use letters, digits, '-' or '_'"
        )
    # tempfile loads only here: the launcher imports this module on its start-up path.
    import tempfile

    if log_dir is None:
        base = Path(tempfile.mkdtemp(prefix="numarun_"))
        if announce:
            sys.stderr.write(f"numarun: worker logs go to {base}\n")
    else:
        base = Path(log_dir)
        if base.exists() and not base.is_dir():
            raise UsageError(f"--log-dir {str(base)!r} exists and is not a directory")
        try:
            owner = base.stat().st_uid
        except OSError:
            owner = os.geteuid()  # missing: made below, then ours
        if owner not in (0, os.geteuid()):
            raise UsageError(
                f"--log-dir {str(base)!r} belongs to another user (uid {owner}); numarun "
                "writes logs only into directories of yours or root's"
            )
    run_dir = base / run_id
    try:
        base.mkdir(parents=True, exist_ok=True)
        try:
            run_dir.mkdir()
        except FileExistsError:
            run_dir = Path(tempfile.mkdtemp(prefix=f"{run_id}_", dir=base))
            if announce:
                sys.stderr.write(
                    f"numarun: {base / run_id} already exists; this run's logs go to {run_dir}\n"
                )
        attempt = run_dir / "attempt_0"
        for local_rank in range(nprocs):
            (attempt / str(local_rank)).mkdir(parents=True)
    except OSError as err:
        raise UsageError(
            f"cannot create log directory {str(run_dir)!r}: {err.strerror or err}; "
            "choose another --log-dir"
        ) from None
    return attempt


def rank_log_dir(attempt_dir: Path, local_rank: int) -> Path:
    """``attempt_dir/<local_rank>``: where one rank's ``stdout.log``/``stderr.log`` live."""
    return Path(attempt_dir) / str(local_rank)


def error_file_path(attempt_dir: Path, local_rank: int) -> Path:
    """``attempt_dir/<local_rank>/error.json``: the rank's ``$TORCHELASTIC_ERROR_FILE``."""
    return rank_log_dir(attempt_dir, local_rank) / ERROR_JSON


def make_prefix(
    rank: int,
    local_rank: int,
    *,
    role_name: str = "default",
    template: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> bytes:
    """The console prefix for one rank's tee'd lines, as bytes.

    ``template`` (or, when None, ``$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` from ``environ``,
    default ``os.environ``) is expanded like torchrun does, with ``string.Template``'s
    ``safe_substitute`` of ``${role_name}``, ``${rank}`` (global) and ``${local_rank}``; unknown
    ``$names`` stay as written, and the result is used as is (no space added). Without a
    template (unset or empty) the prefix is torchrun's ``[<role_name><local_rank>]:``
    (``[default0]:``, no space). Text that is not valid UTF-8 (surrogate escapes from the
    environment) is encoded back to its original bytes.
    """
    if template is None:
        template = (os.environ if environ is None else environ).get(PREFIX_TEMPLATE_ENV) or None
    if not template:
        return f"[{role_name}{local_rank}]:".encode("utf-8", "surrogateescape")
    import string

    text = string.Template(template).safe_substitute(
        role_name=role_name, rank=rank, local_rank=local_rank
    )
    return text.encode("utf-8", "surrogateescape")


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write every byte of ``data`` to ``fd``, however many ``os.write`` calls that takes.

    Short writes continue where they stopped; ``EINTR`` is retried; ``EAGAIN`` on a non-blocking
    fd waits (``poll``, no timeout) until the fd is writable again, so a slow console applies
    back-pressure instead of losing output. Other ``OSError`` (``EPIPE``...) propagates.
    """
    view = memoryview(data)
    poller: select.poll | None = None
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except BlockingIOError:
            if poller is None:
                poller = select.poll()
                poller.register(fd, select.POLLOUT)
            poller.poll()
            continue
        view = view[written:]


# --- the console ---------------------------------------------------------------------------------

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


def _open_log(path: str | os.PathLike[str]) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)


# What a log file that cannot be written (disk full) keeps in memory until it can: the newest
# bytes, so that a crash's last lines survive; older ones are dropped and counted.
DEFAULT_MAX_PENDING = 1024 * 1024


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
    ``feed`` after ``close`` raises ``ValueError``.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        write: Callable[[int, memoryview], int] = os.write,
    ) -> None:
        self.path = Path(path)
        self.error: OSError | None = None
        self.lost = 0
        self._fd: int | None = _open_log(path)
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
            chunk = bytes(waiting[:_CONSOLE_CHUNK])
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
    """

    def __init__(self, path: str | os.PathLike[str], needles: tuple[str, ...]) -> None:
        self._file = FileSink(path)
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
      :class:`FileSink`.
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
    ) -> None:
        self.path = None if path is None else Path(path)
        self._file = None if path is None else FileSink(path)
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


def sinks_for(
    local_rank: int,
    rank: int,
    redirects: int,
    tee: int,
    log_dir_for_rank: Path | None,
    show: bool,
    console_out: int = 1,
    console_err: int = 2,
    *,
    prefix: bytes | None = None,
    max_held: int = DEFAULT_MAX_HELD,
    duplicates: tuple[LineFilter | None, LineFilter | None] = (None, None),
) -> tuple[OutputSink | None, OutputSink | None]:
    """The (stdout, stderr) sinks for one worker, following torchrun's rules per stream.

    ``redirects`` and ``tee`` are this rank's :class:`Std` values. For each stream:

    * tee'd: :class:`TeeSink` -- the file ``log_dir_for_rank/std{out,err}.log`` (none if
      ``log_dir_for_rank`` is None) and, when ``show``, prefixed lines on ``console_out`` /
      ``console_err``;
    * redirected only: :class:`FileSink` on that file (nothing on the console);
    * neither, not ``show`` (hidden by ``--local-ranks-filter``): :class:`NullSink`;
    * neither, ``show``: ``None`` -- the worker inherits the launcher's fd, no pipe.

    ``prefix`` defaults to :func:`make_prefix` ``(rank, local_rank)``. ``duplicates``: the
    (stdout, stderr) :class:`LineFilter` that shown tee'd lines also go to. A redirect with
    ``log_dir_for_rank`` None raises :class:`UsageError` (there is nowhere to put the file).
    """
    if log_dir_for_rank is None and redirects & ~tee & Std.ALL:
        raise UsageError(
            f"--redirects sends local rank {local_rank}'s output to files, "
            "but there is no log directory: give --log-dir"
        )
    if prefix is None:
        prefix = make_prefix(rank, local_rank)
    chosen: list[OutputSink | None] = []
    for bit, name, console, duplicate in (
        (Std.OUT, STDOUT_LOG, console_out, duplicates[0]),
        (Std.ERR, STDERR_LOG, console_err, duplicates[1]),
    ):
        path = None if log_dir_for_rank is None else Path(log_dir_for_rank) / name
        if tee & bit:
            chosen.append(
                TeeSink(path, console, prefix, show, max_held=max_held, duplicate=duplicate)
            )
        elif redirects & bit and path is not None:
            chosen.append(FileSink(path))
        else:
            chosen.append(None if show else NullSink())
    return chosen[0], chosen[1]
