"""What runs inside every worker of :func:`numarun.spawn`, before and around the user's ``fn``.

Three entry points, one per start method, all ending in :func:`call_and_report`:

* ``spawn``: the supervisor execs ``python -c "from numarun._worker import main; main()"`` with
  the binding already applied at birth; :func:`main` reads the payload from the fd named by
  ``NUMARUN_PAYLOAD_FD``, writes the result to the fd named by ``NUMARUN_RESULT_FD`` and exits.
* ``fork``: the supervisor forks and, after binding, calls a ``functools.partial`` of
  :func:`run_fork_call` that holds ``fn`` itself (nothing is pickled on the way in).
* ``forkserver``: the forkserver's child calls :func:`run_forked` after binding; it unpickles
  ``fn`` only then, so nothing of the user's runs before the binding is in force.

The payload is two pickles back to back: a header dict (``local_rank``, ``sys_path``, ``prep``:
:mod:`multiprocessing` preparation data or None) and the ``(fn, args)`` pair. The supervisor
has set the worker's environment (exec: ``execve``; fork/forkserver: ``os.environ``).

The result is one pickle: ``("ok", value)`` or ``("raised", traceback text)``. Exit status: 0
after ``("ok", ...)``, 1 after ``("raised", ...)``, and ``n`` when ``fn`` raised
``SystemExit(n)`` (``SystemExit(None)`` is 0; a non-integer code is printed to stderr and gives
1, as Python itself does); in that case nothing is written to the result pipe.

Imports stay minimal on purpose: this module runs first in every spawned worker and the start-up
time of N workers is benchmarked against N bare interpreters. :mod:`multiprocessing` is imported
only when ``fn`` lives in the parent's ``__main__``; :mod:`traceback` only when ``fn`` raised.
Each entry point first arms numarun's stack dumps (:func:`numarun._stackdump.arm`), so
``numarun stacks`` sees ``fn`` under every start method.
"""

from __future__ import annotations

import io
import os
import pickle
import sys

from numarun._stackdump import arm as arm_stacks

# typing is not imported at run time: this module is on every worker's start-up path.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

PAYLOAD_FD_ENV = "NUMARUN_PAYLOAD_FD"
RESULT_FD_ENV = "NUMARUN_RESULT_FD"

# True while this worker imports the parent's main module: numarun.spawn called from module
# level of a script without an ``if __name__ == "__main__":`` guard must fail, not fork-bomb.
importing_main = False


def main() -> None:
    """Entry point of a worker started with ``start_method="spawn"``; never returns.

    Exits with the status described in the module docstring. Without the two environment
    variables (not started by numarun) it prints one line to stderr and exits 2.
    """
    try:
        payload_fd = int(os.environ.pop(PAYLOAD_FD_ENV))
        result_fd = int(os.environ.pop(RESULT_FD_ENV))
    except (KeyError, ValueError):
        sys.stderr.write(
            f"numarun._worker: {PAYLOAD_FD_ENV} / {RESULT_FD_ENV} are not set; "
            "this module runs inside workers started by numarun.spawn\n"
        )
        sys.exit(2)
    # Programs that fn execs must not hold the result pipe.
    os.set_inheritable(result_fd, False)
    arm_stacks()
    sys.exit(run_payload(payload_fd, result_fd))


def run_forked(payload_fd: int, result_fd: int) -> int:
    """Fork target for ``start_method="forkserver"``: unpickle ``fn`` now, after binding, run it.

    Returns the exit status (see the module docstring); the supervisor exits with it. The
    supervisor has already made ``os.environ`` the worker's environment.
    """
    arm_stacks()
    return run_payload(payload_fd, result_fd)


def run_fork_call(
    fn: Callable[..., Any],
    args: Sequence[Any],
    local_rank: int,
    payload_fd: int,
    result_fd: int,
) -> int:
    """Fork target for ``start_method="fork"`` (bound with ``functools.partial``).

    A forked child already holds ``fn`` and ``args``, so ``payload_fd`` is unused (-1); the
    supervisor has already made ``os.environ`` the worker's environment. Returns the exit status.
    """
    arm_stacks()
    return call_and_report(fn, args, local_rank, result_fd)


def run_payload(payload_fd: int, result_fd: int) -> int:
    """Read the payload to EOF, prepare the interpreter, unpickle ``fn`` and run it."""
    stream = io.BytesIO(read_all(payload_fd))
    os.close(payload_fd)
    header = pickle.load(stream)
    sys.path[:] = header["sys_path"]
    try:
        if header["prep"] is not None:
            prepare_main(header["prep"])
        fn, args = pickle.load(stream)
    except BaseException:
        return report_exception(result_fd, "while loading fn and args in the worker")
    del stream
    return call_and_report(fn, args, header["local_rank"], result_fd)


def call_and_report(
    fn: Callable[..., Any], args: Sequence[Any], local_rank: int, result_fd: int
) -> int:
    """Run ``fn(local_rank, *args)``, write its outcome to ``result_fd``; return the exit status."""
    try:
        value = fn(local_rank, *args)
    except SystemExit as exc:
        os.close(result_fd)
        return exit_status(exc.code)
    except BaseException as exc:
        # The traceback starts at fn: the frame of this bootstrap says nothing to the user.
        exc.__traceback__ = exc.__traceback__.tb_next if exc.__traceback__ else None
        return report_exception(result_fd, None)
    try:
        data = pickle.dumps(("ok", value), protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:
        return report_exception(result_fd, "while pickling the return value of fn")
    del value
    write_and_close(result_fd, data)
    return 0


def report_exception(result_fd: int, context: str | None) -> int:
    """Write ``("raised", traceback)`` for the exception being handled; return 1."""
    import traceback

    exc = sys.exc_info()[1]
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    if context is not None:
        text = f"{text}(raised {context})\n"
    write_and_close(result_fd, pickle.dumps(("raised", text), protocol=pickle.HIGHEST_PROTOCOL))
    return 1


def exit_status(code: object) -> int:
    """Python's own mapping of a ``SystemExit`` code to a process exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    sys.stderr.write(f"{code}\n")
    return 1


def prepare_main(prep: dict[str, Any]) -> None:
    """Import the parent's ``__main__`` as ``__mp_main__`` the way :mod:`multiprocessing` does."""
    global importing_main
    import multiprocessing.spawn

    importing_main = True
    try:
        multiprocessing.spawn.prepare(prep)
    finally:
        importing_main = False


def read_all(fd: int) -> bytes:
    """Read ``fd`` until EOF."""
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def write_and_close(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (a pipe the supervisor drains), then close it.

    A supervisor that is gone (``BrokenPipeError``) is ignored: it kills us anyway.
    """
    view = memoryview(data)
    try:
        while view:
            view = view[os.write(fd, view[: 1 << 20]) :]
    except BrokenPipeError:
        pass
    finally:
        os.close(fd)
