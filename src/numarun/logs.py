"""Worker output: per-rank log files in torchrun's layout, ``--tee`` line framing, redirect specs.

The supervisor reads each worker's stdout and stderr from pipes and hands the raw chunks, in
order, to one *sink* per stream (``feed(data)``; ``close()`` once at EOF). This module makes
those sinks:

* :class:`FileSink` writes the bytes to ``stdout.log`` / ``stderr.log`` untouched.
* :class:`TeeSink` writes the bytes to the file too, and shows *complete lines* on the
  launcher's console, each with torchrun's ``[default3]:`` prefix (role and local rank), one
  ``os.write`` per batch of lines, so two ranks' half-lines can never merge into one console
  line; with a :class:`LineFilter` it also copies matching lines to one shared file
  (torchrun's ``--duplicate-stdout-filters``).
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
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from numarun.errors import UsageError

__all__ = [
    "DEFAULT_MAX_HELD",
    "PREFIX_TEMPLATE_ENV",
    "FileSink",
    "LineFilter",
    "NullSink",
    "OutputSink",
    "Std",
    "TeeSink",
    "error_file_path",
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


class OutputSink(Protocol):
    """Where the supervisor sends one stream of one worker (the supervisor's contract)."""

    def feed(self, data: bytes) -> None: ...

    def close(self) -> None: ...


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
    ``.``/``..`` or contains ``/`` or NUL, a LOG_DIR that exists but is not a directory, or
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


def _open_log(path: str | os.PathLike[str]) -> int:
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)


class FileSink:
    """Write one stream's raw bytes to a file, unbuffered (torchrun's ``stdout.log``).

    The file is created (truncated) when the sink is made, so an empty file means the worker
    wrote nothing; ``OSError`` from creating it propagates. Each ``feed`` is written in full
    before it returns (no user-space buffer), so whatever a worker wrote before it was killed,
    half lines included, is in the file. A failed write (disk full, I/O error) must not take a
    training run down with it: the sink says so in one line on stderr, keeps the error in
    ``self.error`` and drops the rest of the stream. ``close`` closes the file; a second
    ``close`` does nothing; ``feed`` after ``close`` raises ``ValueError``.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.error: OSError | None = None
        self._fd: int | None = _open_log(path)
        self._closed = False

    def feed(self, data: bytes) -> None:
        if self._closed:
            raise ValueError(f"feed() after close() on {self.path}")
        if self._fd is None:
            return  # an earlier write failed and was reported
        try:
            write_all(self._fd, data)
        except OSError as err:
            self._give_up(err)

    def close(self) -> None:
        self._closed = True
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def _give_up(self, err: OSError) -> None:
        self.error = err
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        sys.stderr.write(
            f"numarun: cannot write {self.path}: {err.strerror or err}; "
            "the rest of this stream is not saved\n"
        )
        sys.stderr.flush()


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
      lines of one ``feed`` go out in ONE :func:`write_all` call, as soon as they arrive; the
      supervisor calls sinks one at a time, so output of two sinks sharing ``console_fd`` never
      interleaves below line granularity. The bytes after the last newline are held until their
      newline arrives; at ``close()`` a held partial line is shown with a newline added.
    * Memory bound: when more than ``max_held`` bytes (64 KiB) are held without a newline, they
      are shown at once as a line of their own (newline added) and the rest of that line comes
      later under a new prefix. The file still has the line unbroken.
    * A line that already starts with ``prefix`` (``[rank1]: `` from torch's own
      excepthook, with that prefix template) is shown without a second one.
    * ``duplicate`` (when shown): the shown lines also go through this :class:`LineFilter`.
    * A console that is gone (``EPIPE``, e.g. ``numarun ... | head``, or ``EIO``) stops the
      console part of this sink silently; the file (and ``duplicate``) keep receiving
      everything. File write errors are handled as in :class:`FileSink`. ``EAGAIN`` waits
      (see :func:`write_all`).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None,
        console_fd: int,
        prefix: bytes,
        show: bool = True,
        *,
        max_held: int = DEFAULT_MAX_HELD,
        duplicate: LineFilter | None = None,
    ) -> None:
        self.path = None if path is None else Path(path)
        self._file = None if path is None else FileSink(path)
        self._console_fd = console_fd
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
        try:
            write_all(self._console_fd, text)
        except OSError:
            # The console is gone (EPIPE after `| head`, EIO from a hung-up terminal): nobody
            # can read it any more, and the file still gets everything.
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
