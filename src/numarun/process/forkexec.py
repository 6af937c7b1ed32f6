"""What runs in a worker process between fork and the worker's own code, and the fd bookkeeping
it needs. Used by :mod:`numarun.process.starting`, where the supervisor starts its workers. The
parent of ``"exec"`` and ``"fork"`` workers is the supervisor's watchdog, which forks them.

``start="exec"`` (:func:`exec_child`, in a child of :func:`fork`), in this order:

0. with every signal still blocked (the watchdog forks with them blocked), the signals with a
   handler (the supervisor's, copied with the process: they would swallow a teardown signal
   sent before exec) and every ignored disposition but the teardown signals the supervisor
   keeps ignored on purpose (``keep_ignored``: SIGHUP under ``nohup``) are set to their default
   action, then the signal mask is emptied: ignored dispositions and the mask survive
   ``execve``, and what arrived meanwhile acts now;
1. ``setsid()``: own session and process group, so terminal signals reach the supervisor and
   not the workers;
2. ``PR_SET_PDEATHSIG(SIGKILL)``;
3. the parent check: if ``getppid()`` is no longer the parent that forked it (the watchdog),
   the child exits 1 (this closes the race with a parent that died before step 2); then the
   spec's ``make_dir``, if any (``mkdir``: a worker never started costs no directory);
4. binding: the CPU affinity and memory policy, when the spec has any (both survive
   ``execve``);
5. the stdout/stderr pipes, for streams that have a sink, are dup'ed onto fds 1 and 2;
6. fds other than 0-2, the error pipe and the payload/result pipes are closed;
7. ``chdir`` to the spec's ``cwd``, if any;
8. ``execve`` of the program the supervisor resolved on the worker's ``PATH``, with the worker's
   environment.

A failure in any step writes ``stage:errno:message`` (``setup``, ``dir``, ``bind``, ``exec``) to
the close-on-exec error pipe and exits 127; the supervisor reads end of file on that pipe once
the exec succeeded, else the report, which :meth:`Supervisor.start` raises.

``start="fork"`` (:func:`fork_child`, in a child of :func:`fork`), in this order: every fd in
the registry below except the worker's own pipes and ``pass_fds`` is closed and the registry is
emptied (what the child opens later may reuse those numbers, and must stay open in the children
it forks in turn); the wakeup fd is unset, the caller's own signal handlers are put back and
then the caller's signal mask (it is forked with every signal blocked, so that a signal sent
before finds the caller's handlers); then the forked preamble: ``setsid()``,
``PR_SET_PDEATHSIG(SIGKILL)``, SIGCHLD at its default action (a caller that ignores it would
have the kernel reap the worker's own children), the parent check (exit 1), binding, the
stdout/stderr pipes dup'ed onto fds 1 and 2 with ``sys.stdout``/``sys.stderr`` reopened on
them, ``os.environ`` replaced by the worker's environment (in the child only), ``chdir``; then
``fork_target(payload_fd, result_fd)``. Its return value is the exit status (None: 0, an int:
that int & 0xFF, anything else: 1); ``SystemExit(n)`` exits ``n`` as Python does; any other
exception prints its traceback on fd 2 and exits 1. The child never returns into the caller's
stack (``os._exit``).

``start="forkserver"`` (:func:`forkserver_child`, a :class:`multiprocessing.Process` target,
pickled by module and name): multiprocessing's forkserver forks the child and hands it the
worker's pipes (:class:`InheritedFd`); the child runs the same forked preamble (its parent is
the forkserver, whose death fires the parent-death signal; the parent check is skipped when the
forkserver's pid is unknown), then ``fork_target`` as above.

In both, :data:`passed_fds` holds the spec's ``pass_fds`` as fd numbers of the child (the same
numbers after a fork; those the forkserver handed over in a forkserver child), in order.

The fd registry: every fd a supervisor holds open is tracked (:func:`track`, :func:`close`), so
that children started with ``os.fork()`` close them all, those of other supervisors running in
other threads included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence

from numarun.placement import binding

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from numarun.placement.binding import MemPolicy
    from numarun.process.spec import WorkerSpec

PIPE_SIZE = 1024 * 1024  # payload/result throughput: fewer wake-ups per megabyte
_NOT_OURS_EXIT = 1  # a child whose supervisor died before the preamble finished

# Every fd a supervisor holds open, so that children started with os.fork() close them all
# (those of other supervisors running in other threads included).
_open_fds: set[int] = set()
_open_fds_lock = threading.Lock()

# In a fork or forkserver child: WorkerSpec.pass_fds as this process's fd numbers, in order.
passed_fds: list[int] = []

try:
    # The C call: signal.pthread_sigmask turns the old mask into a set of enum members, 40 us
    # for a full mask, in every child between fork and exec.
    from _signal import pthread_sigmask as set_signal_mask
except ImportError:  # another Python than CPython
    set_signal_mask = signal.pthread_sigmask


# --- fds -----------------------------------------------------------------------------------------


def track(fd: int) -> int:
    with _open_fds_lock:
        _open_fds.add(fd)
    return fd


def close(fd: int | None) -> None:
    if fd is None:
        return
    with _open_fds_lock:
        _open_fds.discard(fd)
    with contextlib.suppress(OSError):
        os.close(fd)


def close_untracked(fd: int) -> None:
    """Forget ``fd`` without closing it: its owner (a socket, selector or file object) does."""
    with _open_fds_lock:
        _open_fds.discard(fd)


def parent_pipe(*, parent_reads: bool) -> tuple[int, int]:
    """A pipe as (parent end, child end); the parent end is non-blocking and tracked."""
    read_fd, write_fd = os.pipe()
    parent, child = (read_fd, write_fd) if parent_reads else (write_fd, read_fd)
    os.set_blocking(parent, False)
    track(parent)
    track(child)
    return parent, child


def enlarge_pipe(fd: int) -> None:
    try:
        import fcntl

        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
    except (OSError, AttributeError, ImportError):
        pass  # /proc/sys/fs/pipe-max-size may be lower; the default size only costs wake-ups


# --- the child's side ----------------------------------------------------------------------------


def fork() -> int:
    """os.fork() without Python 3.12's DeprecationWarning about forking a multi-threaded
    process: the child runs only plain os calls (no locks, no imports) before exec or the fork
    target, which is the documented contract of start="exec" / "fork".

    Python counts the process's threads as the kernel does, native ones included (a BLAS pool,
    faulthandler's), so whether it warns cannot be told from ``threading``. Instead one filter
    is added to :mod:`warnings`, once, that matches only this warning raised from this module
    (``warnings.catch_warnings`` would swap the whole process's filters around the fork, under
    every other thread's feet). Where a caller's own filters replace it later, the warning is
    shown, or with ``error`` swallowed by Python itself: os.fork() never fails over it."""
    if sys.version_info >= (3, 12) and not _fork_warning_filtered:
        _filter_fork_warning()
    return os.fork()


_fork_warning_filtered = False


def _filter_fork_warning() -> None:
    global _fork_warning_filtered
    import warnings

    warnings.filterwarnings(
        "ignore",
        message=r"This process \(pid=\d+\) is multi-threaded, use of fork\(\)",
        category=DeprecationWarning,
        module=r"numarun\.process\.forkexec\Z",
    )
    _fork_warning_filtered = True


def exec_child(
    error_fd: int,
    parent_pid: int,
    spec: WorkerSpec,
    program: str,
    env: Mapping[str, str],
    pass_fds: Sequence[int],
    stdout_fd: int | None,
    stderr_fd: int | None,
    reset_signals: Sequence[int] = (signal.SIGPIPE, signal.SIGXFSZ),
) -> None:
    """Body of a ``start="exec"`` child between fork and exec; never returns.

    ``reset_signals``: the signals set back to their default action first thing (those with
    a handler, and :func:`ignored_signals` but those the caller keeps ignored on purpose); the
    child is forked with every signal blocked, and unblocks them all once they are reset.

    On failure it writes ``stage:errno:message`` to ``error_fd`` (close-on-exec, so the parent
    reads end of file when exec succeeds) and exits 127.
    """
    stage = "setup"
    try:
        # First, with every signal still blocked by the watchdog: the supervisor's handlers
        # (copied with the process) would swallow a teardown signal sent before exec, and an
        # ignored disposition would outlive exec, but for those kept on purpose. Then the
        # mask is emptied (a caller's thread that blocks SIGTERM must not make the workers
        # deaf to teardown): what came meanwhile acts now, with its default action.
        for signum in reset_signals:
            with contextlib.suppress(OSError, ValueError):
                signal.signal(signum, signal.SIG_DFL)
        set_signal_mask(signal.SIG_SETMASK, ())
        os.setsid()
        binding.set_parent_death_signal(signal.SIGKILL)
        if os.getppid() != parent_pid:
            os._exit(_NOT_OURS_EXIT)
        if spec.make_dir is not None:
            stage = "dir"
            with contextlib.suppress(FileExistsError):
                os.mkdir(spec.make_dir, 0o755)
        stage = "bind"
        if spec.cpus is not None or spec.mem is not None:
            binding.apply_in_child(spec.cpus, spec.mem)
        stage = "setup"
        for fd, target in ((stdout_fd, 1), (stderr_fd, 2)):
            if fd is not None:
                os.dup2(fd, target)
        keep = sorted({0, 1, 2, error_fd, *pass_fds})
        for fd in pass_fds:
            os.set_inheritable(fd, True)
        # As subprocess's close_fds=True: the caller's inheritable fds stay out of workers.
        for low, high in zip(keep, [*keep[1:], 1 << 20], strict=True):
            if high > low + 1:
                os.closerange(low + 1, high)
        if spec.cwd is not None:
            os.chdir(spec.cwd)
        stage = "exec"
        os.execve(program, list(spec.argv or ()), env)
    except BaseException as exc:
        code = getattr(exc, "errno", None) or 0
        detail = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        with contextlib.suppress(BaseException):
            os.write(error_fd, f"{stage}:{code}:{detail}".encode(errors="replace")[:4000])
    finally:
        os._exit(127)


def ignored_signals() -> list[int]:
    """The signals this process ignores, as the kernel has them (``SigIgn`` in
    ``/proc/self/status``: also those ignored from C, which ``signal.getsignal`` does not
    know); Python's own SIGPIPE and SIGXFSZ where that file cannot be read."""
    try:
        with open("/proc/self/status", "rb") as status:
            for line in status:
                if line.startswith(b"SigIgn:"):
                    mask = int(line.split()[1], 16)
                    return [bit + 1 for bit in range(64) if mask >> bit & 1]
    except (OSError, ValueError, IndexError):
        pass
    return [signal.SIGPIPE, signal.SIGXFSZ]


def _run_target(target: Callable[[int, int], Any], payload_fd: int, result_fd: int) -> int:
    """Call ``target``; map its outcome to an exit status (see the module docstring)."""
    try:
        value = target(payload_fd, result_fd)
        status = 0 if value is None else (value & 0xFF if isinstance(value, int) else 1)
    except SystemExit as exc:
        code = exc.code
        if code is None:
            status = 0
        elif isinstance(code, int):
            status = code & 0xFF
        else:
            print(code, file=sys.stderr)
            status = 1
    except BaseException:
        _print_exception_to_fd2()
        status = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
    return status


def _print_exception_to_fd2() -> None:
    """The current exception's traceback, written to fd 2 itself: ``sys.stderr`` may be a
    replacement of the parent's (pytest, notebooks) that the child's stderr never sees."""
    try:
        import traceback

        text = "".join(traceback.format_exc()).encode(errors="replace")
        while text:
            text = text[os.write(2, text) :]
    except BaseException:
        pass


def _setup_forked_child(
    *,
    parent_pid: int | None,
    cpus: Sequence[int] | None,
    mem: MemPolicy | None,
    env: Mapping[str, str],
    cwd: str | None,
    stdout_fd: int | None,
    stderr_fd: int | None,
) -> None:
    """The preamble of fork/forkserver children, then their environment and stdio."""
    os.setsid()
    binding.set_parent_death_signal(signal.SIGKILL)
    # A caller (or the fork server) ignoring SIGCHLD: the kernel would reap the worker's own
    # children, and subprocess would report exit status 0 for every one of them.
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if parent_pid is not None and os.getppid() != parent_pid:
        os._exit(_NOT_OURS_EXIT)
    if cpus is not None or mem is not None:
        binding.apply_in_child(cpus, mem)
    for fd, target in ((stdout_fd, 1), (stderr_fd, 2)):
        if fd is not None:
            os.dup2(fd, target)
            os.close(fd)
            _reopen_std_stream(target)
    _become_environ(env)
    if cwd is not None:
        os.chdir(cwd)


def _become_environ(env: Mapping[str, str]) -> None:
    """Make ``os.environ`` (and the C library's environment with it) ``env``, writing only what
    differs: a forked child starts with the caller's ``os.environ``, which ``env`` mostly
    repeats, and every write costs (a clear and a refill was a third of a fork worker's setup
    before its target, from a caller with torch loaded). A variable the caller changed with
    ``os.putenv`` alone, which ``os.environ`` does not know, keeps the C library's value unless
    ``env`` changes it."""
    environ = os.environ
    for key in [key for key in environ if key not in env]:
        del environ[key]
    for key, value in env.items():
        if environ.get(key) != value:
            environ[key] = value


def _reopen_std_stream(fd: int) -> None:
    """Point ``sys.stdout`` (fd 1) or ``sys.stderr`` (fd 2) at the fd itself, now a pipe to
    the supervisor: the parent's object may be a replacement (pytest) that would swallow the
    output, and its buffer belongs to the parent."""
    name = "stdout" if fd == 1 else "stderr"
    line_buffered = fd == 2  # as Python's own stderr; stdout is flushed when the target ends
    # Not a context manager: the stream lives until the child's os._exit().
    stream = open(  # noqa: SIM115
        fd, "w", buffering=1 if line_buffered else -1, errors="backslashreplace", closefd=False
    )
    setattr(sys, name, stream)


def fork_child(
    worker_fds: set[int],
    parent_pid: int,
    spec: WorkerSpec,
    env: Mapping[str, str],
    payload_fd: int,
    result_fd: int,
    stdout_fd: int | None,
    stderr_fd: int | None,
    restore_callers_handlers: Callable[[], None],
    signal_mask: set[int] | None = None,
) -> None:
    """Body of a ``start="fork"`` child; never returns.

    ``restore_callers_handlers`` puts back the signal handlers the caller had before the
    supervisor installed its own (the supervisor passes it in, so this module never imports
    the supervisor); the child is forked with every signal blocked, and ``signal_mask`` (the
    caller's) is put back once they are.
    """
    global _open_fds_lock
    status = 1
    try:
        # No lock here: another thread may have held it at fork time, and we are alone now.
        for fd in [fd for fd in _open_fds if fd not in worker_fds]:
            with contextlib.suppress(OSError):
                os.close(fd)
        # Those numbers are free now: a worker that forks in turn must not close what reuses them.
        _open_fds.clear()
        _open_fds_lock = threading.Lock()
        passed_fds[:] = spec.pass_fds
        with contextlib.suppress(ValueError):
            signal.set_wakeup_fd(-1)
        restore_callers_handlers()  # a forked worker runs under the caller's
        if signal_mask is not None:
            set_signal_mask(signal.SIG_SETMASK, signal_mask)
        _setup_forked_child(
            parent_pid=parent_pid,
            cpus=spec.cpus,
            mem=spec.mem,
            env=env,
            cwd=spec.cwd,
            stdout_fd=stdout_fd,
            stderr_fd=stderr_fd,
        )
        assert spec.fork_target is not None
        status = _run_target(spec.fork_target, payload_fd, result_fd)
    except BaseException:
        _print_exception_to_fd2()
    finally:
        os._exit(status)


class InheritedFd:
    """An fd handed to a forkserver child (pickled as multiprocessing's DupFd); becomes an int."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return (_rebuild_inherited_fd, (reduction.DupFd(self.fd),))


def _rebuild_inherited_fd(dup: Any) -> int:
    return int(dup.detach())


def forkserver_child(
    target: Callable[[int, int], Any],
    parent_pid: int | None,
    cpus: Sequence[int] | None,
    mem: MemPolicy | None,
    env: Mapping[str, str],
    cwd: str | None,
    payload_fd: int,
    result_fd: int,
    stdout_fd: int | None,
    stderr_fd: int | None,
    passed: Sequence[int] = (),
) -> None:
    """Entry of a ``start="forkserver"`` child (a Process target); never returns. ``passed``:
    the spec's ``pass_fds`` as handed over by the forkserver (:data:`passed_fds`)."""
    status = 1
    try:
        passed_fds[:] = passed
        _setup_forked_child(
            parent_pid=parent_pid,
            cpus=cpus,
            mem=mem,
            env=env,
            cwd=cwd,
            stdout_fd=stdout_fd,
            stderr_fd=stderr_fd,
        )
        status = _run_target(target, payload_fd, result_fd)
    except BaseException:
        _print_exception_to_fd2()
    finally:
        os._exit(status)
