"""The log directory of a launch: torchrun's layout, numarun's temporary one, and attempts.

The layout (torchrun adds a random suffix to the run directory)::

    LOG_DIR/<run_id>/attempt_0/<local_rank>/stdout.log
                                            stderr.log
                                            error.json   # $TORCHELASTIC_ERROR_FILE
                              filtered_stdout.log  # --duplicate-stdout-filters, all ranks
                              filtered_stderr.log  # --duplicate-stderr-filters
                     attempt_1/...                 # after a restart (--max-restarts)
                     attempt_1.1/...               # the group re-formed at the same count

:func:`open_log_dir` reaches ``--log-dir`` so that no other user can redirect numarun's
writes (:mod:`numarun.files.safedir`), :func:`make_run` claims a run directory in it (never
deleting or reusing one) and :func:`make_attempt` makes an attempt's, everything relative to
directory descriptors; :func:`make_log_dirs` is the three in one. :func:`rank_log_dir`,
:func:`error_file_path` and :func:`error_file` name a rank's place in an attempt.

A job over several nodes (``--nnodes`` above 1, or a torch rendezvous whose ``--nnodes`` allows
more than one) may share one ``--log-dir`` (a network file system): each node gets its own run
directory named by :func:`node_run_name`, ``<run_id>_node<K>_<HOST>`` (``K`` its node rank,
``HOST`` its host name), with torchrun's layout inside. Under a torch rendezvous the node rank
is known only once the first round has formed: the directory is made as
``<run_id>_<HOST>_joining_<random>`` and renamed by :func:`name_after_round` before any worker
starts (a later round may give the node another rank: the name keeps the first). A name taken
by an earlier run gets ``_<random>`` added, silently (the start line names the directory);
:func:`node_logs_note` says where every node's logs are.

Without ``--log-dir`` the base is a fresh private directory (:func:`temp_log_dir`), and what it
holds (:func:`temp_dir_holds`) decides its end: :data:`ERRORS` (only error files) is removed at
the end, :data:`COPIES` (log files the console showed in full) is kept only after a failure,
:data:`LOGS` (output that is nowhere else) is kept; :func:`log_dir_note` says so in the start line.
Imported on every launch's start-up path: :mod:`pathlib` loads only in :func:`make_log_dirs`
and the ``Path`` helpers.
"""

from __future__ import annotations

import os
import sys

from numarun.errors import UsageError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from pathlib import Path

    from numarun.files.safedir import Directory

STDOUT_LOG = "stdout.log"
STDERR_LOG = "stderr.log"
ERROR_JSON = "error.json"


def make_log_dirs(
    log_dir: str | os.PathLike[str] | None, run_id: str, nprocs: int, *, announce: bool = True
) -> Path:
    """Create ``LOG_DIR/<run_id>/attempt_0/<local_rank>/`` for each rank; return the attempt dir.

    With ``log_dir`` None, LOG_DIR is a fresh :func:`temp_log_dir` (torchrun makes one with
    ``tempfile.mkdtemp(prefix="torchelastic_")``) and, if ``announce``, one line on stderr says
    where. Otherwise :func:`open_log_dir` reaches (or makes) it, refusing one another user
    could redirect. The rest is :func:`make_run`'s: ``<run_id>`` claimed by one atomic
    ``mkdir`` or, when it exists, ``<run_id>_<random>`` (announced); nothing is ever deleted or
    reused. Bad input raises :class:`UsageError` (one line, nothing made).
    """
    from pathlib import Path

    check_run_id(run_id)
    if log_dir is None:
        base = temp_log_dir()
        if announce:
            sys.stderr.write(f"numarun: worker logs go to {base.path}\n")
    else:
        base = open_log_dir(os.fspath(log_dir))
    with base:
        run, attempt = make_run(base, run_id, nprocs, fresh=log_dir is None, announce=announce)
    run.close()
    attempt.close()
    return Path(attempt.path)


def check_run_id(run_id: str) -> None:
    """:class:`UsageError` unless ``run_id`` can name one directory."""
    if not run_id or run_id in (".", "..") or "/" in run_id or "\0" in run_id:
        raise UsageError(
            f"run id {run_id!r} cannot name a log directory: use letters, digits, '-' or '_'"
        )


def open_log_dir(log_dir: str) -> Directory:
    """``--log-dir``, reached (made where missing) so that no other user can redirect what
    numarun writes there (:func:`numarun.files.safedir.open_directory`'s rules: every
    directory on the way yours or root's and not writable by others without the sticky bit, no
    symbolic link of another user's). :class:`UsageError` (one line) otherwise."""
    from numarun.files.safedir import open_directory

    return open_directory(log_dir, what="--log-dir", create=True)


def host_label(host: str | None = None) -> str:
    """This machine's host name (or ``host``) as part of a directory name: letters, digits,
    ``.`` and ``-`` kept, anything else ``-``, at most 64 characters (``"host"`` when empty)."""
    import _socket  # not socket: its enums cost a launch milliseconds

    name = _socket.gethostname() if host is None else host
    kept = "".join(c if c.isascii() and (c.isalnum() or c in ".-") else "-" for c in name)
    return kept.strip(".")[:64] or "host"


def node_run_name(run_id: str, node_rank: int | str, host: str) -> str:
    """``<run_id>_node<K>_<HOST>``: one node's run directory in a shared ``--log-dir``."""
    return f"{run_id}_node{node_rank}_{host}"


def make_run(
    base: Directory,
    run_id: str,
    nprocs: int,
    *,
    fresh: bool,
    announce: bool = True,
    rank_dirs: bool = True,
    name: str | None = None,
) -> tuple[Directory, Directory]:
    """Claim ``base/<run_id>/`` and make ``attempt_0/`` in it, and in that ``<local_rank>/``
    for ``nprocs`` ranks unless ``rank_dirs`` is False (:func:`make_attempt`); return (run
    dir, attempt dir), both open (the caller closes them).

    A ``fresh`` base (our own new temporary directory) cannot hold an earlier run. Otherwise,
    when ``<run_id>`` exists (an earlier run) this run takes ``<run_id>_<random>/`` --
    torchrun's naming -- and, if ``announce``, says so on stderr; nothing is deleted or
    reused, so a stale ``error.json`` is never read as this run's. ``name`` (a node's
    directory, :func:`node_run_name`) replaces ``<run_id>``, and a taken one gets
    ``_<random>`` without a word: the start line names the directory. Everything is made
    relative to ``base``'s descriptor (:class:`numarun.files.safedir.Directory`).
    :class:`UsageError` (one line) when a directory cannot be made.
    """
    check_run_id(run_id)
    wanted = run_id if name is None else name
    run: Directory | None = None
    try:
        try:
            run = base.make(wanted)
        except FileExistsError:
            if fresh:
                raise
            for _ in range(100):
                try:
                    run = base.make(f"{wanted}_{os.urandom(4).hex()}")
                    break
                except FileExistsError:
                    continue
            else:
                raise
            if announce and name is None:
                sys.stderr.write(
                    f"numarun: {os.path.join(base.path, run_id)} already exists; "
                    f"this run's logs go to {run.path}\n"
                )
        return run, make_attempt(run, "attempt_0", nprocs, rank_dirs=rank_dirs)
    except OSError as err:
        if run is not None:
            run.close()
        where = run.path if run is not None else os.path.join(base.path, wanted)
        raise UsageError(
            f"cannot create log directory {where!r}: {err.strerror or err}; "
            "choose another --log-dir"
        ) from None
    except BaseException:
        if run is not None:
            run.close()
        raise


def name_after_round(
    base: Directory, run: Directory, attempt: Directory, run_id: str, node_rank: int, host: str
) -> None:
    """Rename ``run`` (made in ``base`` under a provisional name, before the rendezvous) to
    :func:`node_run_name` now that the node rank is known, ``_<random>`` added when the name
    is taken; ``run.path`` and ``attempt.path`` (an attempt directory in it, not yet used by
    any worker) follow. Relative to ``base``'s descriptor; a rename that fails (the file
    system refuses it) leaves the provisional name, which the start line then names."""
    old = os.path.basename(run.path)
    wanted = node_run_name(run_id, node_rank, host)
    for candidate in [wanted, *(f"{wanted}_{os.urandom(4).hex()}" for _ in range(100))]:
        try:
            os.stat(candidate, dir_fd=base.fd, follow_symlinks=False)
            continue  # taken (an earlier run's): a rename would replace an empty directory
        except FileNotFoundError:
            pass
        except OSError:
            return
        try:
            os.rename(old, candidate, src_dir_fd=base.fd, dst_dir_fd=base.fd)
        except FileExistsError:
            continue
        except OSError:
            return
        path = os.path.join(base.path, candidate)
        attempt.path = os.path.join(path, os.path.basename(attempt.path))
        run.path = path
        return


def node_logs_note(run_dir: str, run_id: str) -> str:
    """Where every node's logs are, for a job over several nodes sharing ``--log-dir``: this
    node's run directory and the rule naming the others' beside it."""
    rule = node_run_name(run_id, "<K>", "<HOST>")
    return f"{run_dir} (this node; every node's: {rule}[_<random>] beside it)"


def make_attempt(run: Directory, name: str, nprocs: int, *, rank_dirs: bool = True) -> Directory:
    """``<run dir>/<name>/``, and ``<local_rank>/`` in it for ``nprocs`` ranks unless
    ``rank_dirs`` is False, made relative to ``run``'s descriptor, never reused; returns the
    attempt directory, open. ``OSError`` (a full disk, ``FileExistsError``) and
    :class:`UsageError` (a directory swapped while it was made) propagate.

    The launcher makes no rank directory here (``rank_dirs=False``): a rank's is made when
    something first goes there, by the launcher as it opens the rank's log files
    (:func:`numarun.launch.workersetup.worker_sinks`), else by the rank's own process as it starts
    (``WorkerSpec.make_dir``), before the program that may write its error file runs. The
    layout is torchrun's; a rank never started (a teardown signal during a start of thousands)
    costs no directory, to make or to remove."""
    attempt = run.make(name)
    if not rank_dirs:
        return attempt
    try:
        for local_rank in range(nprocs):
            attempt.make(str(local_rank)).close()
    except BaseException:
        attempt.close()
        raise
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


def temp_log_dir() -> Directory:
    """A fresh private directory ``$TMPDIR/numarun_XXXXXXXXXXXX`` (mode 0700), open.

    ``$TMPDIR`` (default ``/tmp``) is reached under :func:`open_log_dir`'s rules (it is not
    made): one of another user, or writable by others without the sticky bit, or reached
    through another user's symbolic link, is refused with :class:`UsageError`. Made by hand
    rather than with :func:`tempfile.mkdtemp`: :mod:`tempfile` costs a few milliseconds to
    import on every launch's start-up path, and cannot make it relative to a descriptor.
    """
    from numarun.files.safedir import open_directory

    base = os.environ.get("TMPDIR") or "/tmp"
    where = open_directory(base, what="TMPDIR")
    with where:
        for _ in range(100):
            try:
                made = where.make(f"numarun_{os.urandom(6).hex()}", 0o700)
            except FileExistsError:
                continue
            except OSError as error:
                raise UsageError(
                    f"cannot create a temporary log directory in {base}: {error.strerror}; "
                    "give --log-dir"
                ) from None
            return made
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
