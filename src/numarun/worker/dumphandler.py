"""Inside a worker: arm numarun's stack dumps before the user's code runs.

:func:`arm` is called first thing by both bootstraps (:mod:`numarun.worker.bootstrap` for scripts
and modules, :mod:`numarun.spawning.childmain` for :func:`numarun.spawn` under every start method).
When the launcher gave this rank a dump file (``NUMARUN_STACKS_FILE``, a path in a private 0700
directory of the launcher's, see :mod:`numarun.stacks.dumps`), it registers
:func:`faulthandler.register` on :data:`STACKS_SIGNAL` with ``all_threads=True`` and
``chain=False``, writing to that file. faulthandler writes from the C signal handler, so a dump
comes even while the rank is blocked in C (a collective) or holds the GIL, and never touches the
rank's stdout or stderr.

The variable is removed from ``os.environ``, so the user's program and its children never see
it (a child started with the same bootstrap is not armed twice on the rank's file). The file is
opened close-on-exec and moved to a high fd number, so that a program closing and reopening
low fds does not get it under a number of its own. Children forked by the rank (DataLoader
workers) inherit the registration, but the launcher only ever signals the rank processes.

If the user's code later registers the same signal (``signal.signal`` or
``faulthandler.register``), its handler replaces numarun's: the user's wins, and the launcher
reports that rank's stacks as unavailable.

This module is on every worker's start-up path: it imports only what a bare interpreter has
already loaded (``os``) and the built-in ``faulthandler``; :mod:`signal` is not imported (its
``enum`` import costs milliseconds), the signal number is a constant.
"""

import faulthandler
import os

STACKS_FILE_ENV = "NUMARUN_STACKS_FILE"
# Real-time signal 42 (SIGRTMIN+8 under glibc, whose SIGRTMIN is 34; within SIGRTMIN..SIGRTMAX
# under musl too). Not SIGUSR1/SIGUSR2: Slurm's --signal and Lightning use them. Its default
# action kills, so the launcher sends it only to a rank whose handler is installed.
STACKS_SIGNAL = 42
_HIGH_FD = 1000  # where the dump fd moves to, when free and allowed


def arm(path: "str | None" = None) -> "tuple[str, int] | None":
    """Register the stack dump for this rank, if the launcher asked for one (``path``, or
    the environment's); never raises. Returns (the file's path, the fd the dumps go to) once
    armed, else None.

    Without ``NUMARUN_STACKS_FILE`` (not started by a numarun that takes stacks) nothing
    happens. A file that cannot be opened or a registration that fails leaves the rank
    running unarmed: the launcher then reports its stacks as unavailable. (A ``--preload``
    standby arms before its imports, on a file it is given at birth: see
    :mod:`numarun.worker.bootstrap`.)
    """
    path = os.environ.pop(STACKS_FILE_ENV, None) or path
    if not path:
        return None
    try:
        # No O_CREAT: the launcher made the file; a rank never creates files of its own here.
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    fd = _move_high(fd)
    try:
        faulthandler.register(STACKS_SIGNAL, file=fd, all_threads=True, chain=False)
    except (OSError, RuntimeError, ValueError):
        os.close(fd)
        return None
    return path, fd


def _move_high(fd: int) -> int:
    """``fd`` duplicated onto a free fd >= 1000 (close-on-exec), or ``fd`` itself when that is
    not possible (a low RLIMIT_NOFILE)."""
    for target in range(_HIGH_FD, _HIGH_FD + 8):
        try:
            os.fstat(target)
            continue  # in use (inherited): never clobber it
        except OSError:
            pass
        try:
            os.dup2(fd, target, inheritable=False)
        except OSError:
            return fd
        os.close(fd)
        return target
    return fd
