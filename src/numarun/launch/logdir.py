"""The log directory of a launch: torchrun's layout, numarun's temporary one, and attempts.

The layout (torchrun adds a random suffix to the run directory)::

    LOG_DIR/<run_id>/attempt_0/<local_rank>/stdout.log
                                            stderr.log
                                            error.json   # $TORCHELASTIC_ERROR_FILE
                              filtered_stdout.log  # --duplicate-stdout-filters, all ranks
                              filtered_stderr.log  # --duplicate-stderr-filters
                     attempt_1/...                 # after a restart (--max-restarts)
                     attempt_1.1/...               # the group re-formed at the same count

:func:`make_log_dirs` claims a run directory under ``--log-dir`` (never deleting or reusing
one); :func:`rank_log_dir`, :func:`error_file_path` and :func:`error_file` name a rank's place
in an attempt; :func:`make_attempt_dir` and :func:`next_attempt_dir` make an attempt's.

Without ``--log-dir`` the base is a fresh private directory (:func:`temp_log_dir`), and what it
holds (:func:`temp_dir_holds`) decides its end: :data:`ERRORS` (only error files) is removed at
the end, :data:`COPIES` (log files the console showed in full) is kept only after a failure,
:data:`LOGS` (output that is nowhere else) is kept; :func:`log_dir_note` says so in the start line.
Imported on every launch's start-up path: :mod:`tempfile` and :mod:`pathlib` load only in
:func:`make_log_dirs` and the ``Path`` helpers.
"""

from __future__ import annotations

import os
import sys

from numarun.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
ERROR_JSON = "error.json"


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
    # tempfile and pathlib load only here: the launcher imports this module on its
    # start-up path.
    import tempfile
    from pathlib import Path

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
    from pathlib import Path

    return Path(attempt_dir) / str(local_rank)


def error_file_path(attempt_dir: Path, local_rank: int) -> Path:
    """``attempt_dir/<local_rank>/error.json``: the rank's ``$TORCHELASTIC_ERROR_FILE``."""
    return rank_log_dir(attempt_dir, local_rank) / ERROR_JSON


def error_file(attempt_dir: str, local_rank: int) -> str:
    """:func:`error_file_path` as a string, without :mod:`pathlib` (the start-up path)."""
    return os.path.join(attempt_dir, str(local_rank), ERROR_JSON)


# What numarun's temporary log directory (no --log-dir) holds, which decides what becomes of it.
ERRORS = "errors"  # only the workers' error files: removed at the end (also if numarun is killed)
COPIES = "copies"  # log files whose every line was shown on the console: kept only on failure
LOGS = "logs"  # output that is nowhere else (--redirects, filters, hidden ranks): kept


def temp_dir_holds(
    outputs: tuple[dict[int, int], dict[int, int], set[int]], *, filtered: bool
) -> str:
    """:data:`ERRORS`, :data:`COPIES` or :data:`LOGS` for a run without ``--log-dir``, from
    its (redirects, tee, shown local ranks) and whether ``--duplicate-std{out,err}-filters``
    copy lines to files of their own (``filtered``)."""
    redirects, tee, shown = outputs
    if filtered:
        return LOGS
    only_in_files = any(
        redirects[rank] & ~tee[rank] or (tee[rank] and rank not in shown) for rank in tee
    )
    if only_in_files:
        return LOGS
    return COPIES if any(tee.values()) else ERRORS


def temp_log_dir() -> str:
    """A fresh private directory ``$TMPDIR/numarun_XXXXXXXXXXXX`` (mode 0700).

    Made by hand rather than with :func:`tempfile.mkdtemp`: :mod:`tempfile` (and :mod:`pathlib`,
    which :func:`make_log_dirs` uses) cost a few milliseconds to import on every launch's
    start-up path.
    ``$TMPDIR`` owned by another user (not root) is refused: its owner could swap our
    directory for a symbolic link between the checks and the writes.
    """
    base = os.environ.get("TMPDIR") or "/tmp"
    try:
        owner = os.stat(base).st_uid
    except OSError as error:
        raise UsageError(
            f"cannot create a temporary log directory in {base}: {error.strerror}; give --log-dir"
        ) from None
    if owner not in (0, os.geteuid()):
        raise UsageError(
            f"TMPDIR {base!r} belongs to another user (uid {owner}); numarun writes only into "
            "directories of yours or root's: set TMPDIR or give --log-dir"
        )
    for _ in range(100):
        path = os.path.join(base, f"numarun_{os.urandom(6).hex()}")
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        except OSError as error:
            raise UsageError(
                f"cannot create a temporary log directory in {base}: {error.strerror}; "
                "give --log-dir"
            ) from None
        return path
    raise UsageError(f"cannot create a temporary log directory in {base}; give --log-dir")


def log_dir_note(log_dir: str, holds: str) -> str:
    """Where the workers' logs go, for the start line: ``logs in DIR`` (``DIR`` the
    ``--log-dir`` run directory, or the temporary directory when it holds log files), whether
    a temporary one stays, or that none is kept (it holds only error files, removed at the
    end)."""
    if holds == COPIES:
        return f"logs in {log_dir} (removed if the run succeeds; --log-dir keeps them)"
    if holds == ERRORS:
        return "logs: console only"
    return f"logs in {log_dir}"


def make_attempt_dir(
    log_base: str, run_id: str, nprocs: int, *, fresh: bool, announce: bool = True
) -> str:
    """``log_base/<run_id>/attempt_0/<local_rank>/`` for ``nprocs`` ranks; returns the attempt
    dir.

    A ``fresh`` base (our own new temporary directory) cannot hold stale files, so the
    directories are made directly; otherwise :func:`make_log_dirs` claims them, taking
    ``<run_id>_<random>/`` when ``<run_id>/`` already exists (it never deletes, and says so on
    stderr if ``announce``), so an old ``error.json`` of the same run id is never read as ours.
    """
    if fresh:
        attempt_dir = os.path.join(log_base, run_id, "attempt_0")
        for local_rank in range(nprocs):
            os.makedirs(os.path.join(attempt_dir, str(local_rank)))
        return attempt_dir
    return str(make_log_dirs(log_base, run_id, nprocs, announce=announce))


def next_attempt_dir(first_dir: str, name: str, nproc: int) -> str:
    """``<run dir>/<name>/<local_rank>/`` beside the first attempt's; never reused."""
    directory = os.path.join(os.path.dirname(first_dir), name)
    for local_rank in range(nproc):
        os.makedirs(os.path.join(directory, str(local_rank)))
    return directory
