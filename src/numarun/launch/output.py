"""Where a launched worker's output goes: torchrun's ``--redirects``/``--tee`` and its rules.

:func:`parse_std_spec` and :func:`parse_ranks_filter` read ``-r/--redirects``, ``-t/--tee`` and
``--local-ranks-filter`` (:class:`Std` values follow torchrun: 0 none, 1 stdout, 2 stderr, 3
both); :func:`make_prefix` is the console prefix of a rank's tee'd lines (torchrun's
``[<role><local rank>]:`` or ``$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``); :func:`sinks_for`
picks one worker's two sinks (:mod:`numarun.process.sinks`) from its values, in the log layout
of :mod:`numarun.launch.logdir`. Imported only when output is redirected, tee'd or filtered.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Mapping

from numarun.errors import UsageError
from numarun.launch.logdir import STDERR_LOG, STDOUT_LOG
from numarun.launch.safedir import Directory, open_directory
from numarun.process.sinks import DEFAULT_MAX_HELD, FileSink, LineFilter, NullSink, TeeSink

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.process.spec import OutputSink

__all__ = [
    "PREFIX_TEMPLATE_ENV",
    "Std",
    "make_prefix",
    "parse_ranks_filter",
    "parse_std_spec",
    "ranks_filter_warning",
    "sinks_for",
]


PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


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
    are comma-separated non-negative integers; spaces around items are ignored, repeats are
    harmless. A rank at or above ``nprocs`` is accepted and left out of the result, as torchrun
    does (scripts pass ``0,1,2,3`` on machines with fewer GPUs): :func:`ranks_filter_warning`
    says so. Anything else raises :class:`UsageError` (one line).
    """
    if not text.strip():
        return set(range(nprocs))
    return {rank for rank in _filter_ranks(text, nprocs) if rank < nprocs}


def ranks_filter_warning(text: str, nprocs: int) -> str | None:
    """The one warning for a ``--local-ranks-filter`` that names local ranks beyond
    ``0..nprocs-1`` (which ranks, and what is shown instead); None when every named rank
    exists. Raises :class:`UsageError` as :func:`parse_ranks_filter` does."""
    if not text.strip():
        return None
    named = _filter_ranks(text, nprocs)
    missing = sorted(rank for rank in named if rank >= nprocs)
    if not missing:
        return None
    shown = sorted(rank for rank in named if rank < nprocs)
    what = (
        f"only local rank{'s' if len(shown) > 1 else ''} {', '.join(map(str, shown))} "
        "will be shown"
        if shown
        else "no rank's output will be shown on the console"
    )
    return (
        f"--local-ranks-filter {text!r} names local rank{'s' if len(missing) > 1 else ''} "
        f"{', '.join(map(str, missing))}, which do{'es' if len(missing) == 1 else ''} not exist "
        f"with {nprocs} process{'es' if nprocs > 1 else ''} per node: {what}"
    )


def _filter_ranks(text: str, nprocs: int) -> set[int]:
    named: set[int] = set()
    for item in text.split(","):
        word = item.strip()
        if not (word.isdigit() and word.isascii()):
            raise UsageError(
                f"--local-ranks-filter {text!r} is not valid: give comma-separated local ranks "
                f"such as 0,2 (0-{nprocs - 1})"
            )
        named.add(int(word))
    return named


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


def sinks_for(
    local_rank: int,
    rank: int,
    redirects: int,
    tee: int,
    log_dir_for_rank: Directory | str | os.PathLike[str] | None,
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

    The files are new (``O_EXCL | O_NOFOLLOW``: ``FileExistsError`` when anything is there),
    made relative to ``log_dir_for_rank``'s descriptor: a
    :class:`numarun.launch.safedir.Directory`, or a path, which is reached under
    :func:`numarun.launch.safedir.open_directory`'s rules first. ``prefix`` defaults to
    :func:`make_prefix` ``(rank, local_rank)``. ``duplicates``: the (stdout, stderr)
    :class:`LineFilter` that shown tee'd lines also go to. A redirect with ``log_dir_for_rank``
    None raises :class:`UsageError` (there is nowhere to put the file).
    """
    if log_dir_for_rank is None and redirects & ~tee & Std.ALL:
        raise UsageError(
            f"--redirects sends local rank {local_rank}'s output to files, "
            "but there is no log directory: give --log-dir"
        )
    if prefix is None:
        prefix = make_prefix(rank, local_rank)
    directory: Directory | None = None
    opened = False
    if log_dir_for_rank is not None and (redirects | tee) & Std.ALL:
        if isinstance(log_dir_for_rank, Directory):
            directory = log_dir_for_rank
        else:
            directory = open_directory(os.fspath(log_dir_for_rank), what="log directory")
            opened = True
    chosen: list[OutputSink | None] = []
    try:
        for bit, name, console, duplicate in (
            (Std.OUT, STDOUT_LOG, console_out, duplicates[0]),
            (Std.ERR, STDERR_LOG, console_err, duplicates[1]),
        ):
            wanted = directory is not None and (tee | redirects) & bit
            fd = directory.create(name) if wanted and directory is not None else None
            path = None if fd is None or directory is None else os.path.join(directory.path, name)
            if tee & bit:
                chosen.append(
                    TeeSink(
                        path, console, prefix, show, max_held=max_held, duplicate=duplicate, fd=fd
                    )
                )
            elif redirects & bit and path is not None:
                chosen.append(FileSink(path, fd=fd))
            else:
                chosen.append(None if show else NullSink())
    except BaseException:
        for sink in chosen:
            if sink is not None:
                sink.close()
        raise
    finally:
        if opened and directory is not None:
            directory.close()
    return chosen[0], chosen[1]
