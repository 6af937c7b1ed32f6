"""Where a launched worker's output goes: torchrun's rules for ``--redirects``/``--tee``.

The values are read by :mod:`numarun.cmdline.stdspec`; :func:`make_prefix` is the console
prefix of a rank's tee'd lines (torchrun's ``[<role><local rank>]:`` or
``$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE``); :func:`sinks_for` picks one worker's two sinks
(:mod:`numarun.process.sinks`) from its values, in the log layout of
:mod:`numarun.files.logdir`. Imported only when output is redirected, tee'd or filtered.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from numarun.cmdline.stdspec import Std
from numarun.errors import UsageError
from numarun.files.logdir import STDERR_LOG, STDOUT_LOG
from numarun.files.safedir import Directory, open_directory
from numarun.process.sinks import DEFAULT_MAX_HELD, FileSink, LineFilter, NullSink, TeeSink

TYPE_CHECKING = False
if TYPE_CHECKING:
    from numarun.process.spec import OutputSink

__all__ = ["PREFIX_TEMPLATE_ENV", "make_prefix", "sinks_for"]


PREFIX_TEMPLATE_ENV = "TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"


def make_prefix(
    rank: int,
    local_rank: int,
    *,
    role_name: str = "default",
    template: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> bytes:
    """The console prefix for one rank's tee'd lines, as bytes.

    ``template`` (``--log-line-prefix-template``; when None or empty,
    ``$TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE`` from ``environ``, default ``os.environ``, as
    torchrun 2.14 prefers its flag to the variable) is expanded like torchrun does, with
    ``string.Template``'s ``safe_substitute`` of ``${role_name}``, ``${rank}`` (global),
    ``${local_rank}`` and ``${hostname}`` (``socket.gethostname()``, the short name torchrun
    2.14 gives; in every torch release here, since numarun expands it itself); unknown
    ``$names`` stay as written, and the result is used as is (no space added). Without a
    template (unset or empty) the prefix is torchrun's ``[<role_name><local_rank>]:``
    (``[default0]:``, no space). Text that is not valid UTF-8 (surrogate escapes from the
    environment) is encoded back to its original bytes.
    """
    if not template:
        template = (os.environ if environ is None else environ).get(PREFIX_TEMPLATE_ENV) or None
    if not template:
        return f"[{role_name}{local_rank}]:".encode("utf-8", "surrogateescape")
    import socket
    import string

    text = string.Template(template).safe_substitute(
        role_name=role_name, rank=rank, local_rank=local_rank, hostname=socket.gethostname()
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
    :class:`numarun.files.safedir.Directory`, or a path, which is reached under
    :func:`numarun.files.safedir.open_directory`'s rules first. ``prefix`` defaults to
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
