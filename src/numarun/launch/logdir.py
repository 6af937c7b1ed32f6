"""The log directory of a launch, torchrun's layout (torchrun adds a random suffix to the run
directory)::

    LOG_DIR/<run_id>/attempt_0/<local_rank>/stdout.log
                                            stderr.log
                                            error.json   # $TORCHELASTIC_ERROR_FILE
                              filtered_stdout.log  # --duplicate-stdout-filters, all ranks
                              filtered_stderr.log  # --duplicate-stderr-filters

:func:`make_log_dirs` claims a run directory under ``--log-dir`` (never deleting or reusing
one); :func:`rank_log_dir` and :func:`error_file_path` name a rank's place in an attempt.
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
